import { defineConfig } from "@hey-api/openapi-ts";

export default defineConfig({
  input: "../../../openapi/holdfast.json",
  output: "generated",
  // The fetch client (generated into generated/client), the types, and one
  // SDK function per operation.
  plugins: ["@hey-api/client-fetch", "@hey-api/typescript", "@hey-api/sdk"],
});
