/** The path of the bundle of src/server.ts as src/ is now, built first if need be (see server-bundle.mjs). */
export function serverBundle(): Promise<string>

/** The path of the CLI's bundle (src/cli/main.ts, exporting `main`), built first if need be. */
export function cliBundle(): Promise<string>
/** Removes old bundles of `name` under `outDir` (all but the newest few, once a day old) and stale temporary folders. */
export function pruneBundles(outDir: string, name: string, nowMs: number): void
