// The two Node globals flow.ts uses, declared here so that type-checking
// needs no @types/node (fetch, Request, Response and crypto come from lib DOM).
declare const process: {
  readonly env: Record<string, string | undefined>;
  exitCode: number | undefined;
};
