import { defineConfig } from "orval";

export default defineConfig({
  holdfast: {
    input: { target: "../../../openapi/holdfast.json" },
    output: {
      target: "./generated/holdfast.ts",
      client: "fetch",
      mode: "single",
      // Header parameters (Idempotency-Key) become a typed argument of each
      // function; without this they are not in the signature at all.
      headers: true,
      override: {
        // Base URL, API key and raw bodies: see transport.ts.
        mutator: { path: "./transport.ts", name: "holdfastFetch" },
      },
    },
  },
});
