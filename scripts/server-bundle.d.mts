/** The path of the bundle of src/server.ts as src/ is now, built first if need be (see server-bundle.mjs). */
export function serverBundle(): Promise<string>
