/**
 * `npm run deps`: no import cycles, and every import points down this order (part of `npm test`).
 *
 *   entry     src/server.ts, src/cli/           start the process (the CLI's `serve` loads server.ts)
 *   wiring    src/broker.ts, src/app.ts,        build the services, the dispatcher and the Fastify app
 *             src/config.ts, src/startup-failure.ts
 *   http      src/http/                         routes, schemas, auth; they call the services (service/services.ts)
 *   service   src/service/                      the rules; they call the cluster and the dispatcher, and the store
 *   cluster   src/cluster/                      this process among the others; it wraps the dispatcher
 *   dispatch  src/dispatch/                     dispatcher → tracker → pusher → store
 *   store     src/store/                        all SQL and Prisma (src/generated/ is Prisma's, for the store only)
 *   shared    src/security/, src/metrics.ts,   used at every level; they import none of the levels above
 *             src/push-metrics.ts
 *   core      src/core/                         the pure rules: partitioner, group settings, delivery ids, consumer
 *                                               assignment, filters, signatures, retry policy, trace context,
 *                                               errors, which database errors mean "not now"; core imports nothing
 *                                               of src/ outside itself, so every level may use it
 *
 * A level may import any level below it, and http reaches the cluster, the dispatcher and the store
 * only through the services. config.ts is read by the wiring alone, so its use of http/scopes.ts
 * (the format of API keys) points down. The SDK (clients/typescript/src) is published on its own: it
 * imports nothing of the broker, and of the broker only the CLI uses it. The console's browser
 * files (src/console/) import only each other and are checked for cycles alone.
 *
 * Type-only imports count: a type that only the level above may declare is still an upward arrow.
 * dependency-cruiser is held at 17.4.3, the last release for Node 20 (18 wants Node 22), and parses
 * with @swc/core: it reads TypeScript with TypeScript's JavaScript API, which TypeScript 7 no
 * longer has. A cruise of the ~165 modules takes 2-7 s on the shared 2-core machine.
 */
const WIRING = '^src/(server|broker|app|config|startup-failure)\\.ts$|^src/cli/'
const CORE = '^src/core/'
const SHARED = '^src/security/|^src/(metrics|push-metrics)\\.ts$'

/** A rule that `from` may not import `to`. */
const forbid = (name, comment, from, to) => ({ name, comment, severity: 'error', from, to })

module.exports = {
  forbidden: [
    forbid('no-circular', 'A module must not import itself back through others: break the cycle.', {}, { circular: true }),
    forbid(
      'not-to-wiring',
      'Only the entry points and the wiring import the wiring (and config): below it, take what you need as parameters.',
      { path: '^src/', pathNot: WIRING },
      { path: WIRING },
    ),
    forbid(
      'http-through-services',
      'Routes reach the data through the services, not the cluster, the dispatcher or the store.',
      { path: '^src/http/' },
      { path: '^src/(cluster|dispatch|store)/' },
    ),
    forbid('service-not-to-http', 'The services are below HTTP.', { path: '^src/service/' }, { path: '^src/http/' }),
    forbid('cluster-not-up', 'The cluster is below HTTP and the services.', { path: '^src/cluster/' }, { path: '^src/(http|service)/' }),
    forbid(
      'dispatch-not-up',
      'The dispatcher is below HTTP, the services and the cluster: what it needs from them is passed in.',
      { path: '^src/dispatch/' },
      { path: '^src/(http|service|cluster)/' },
    ),
    forbid(
      'store-not-up',
      'The store is below everything but the shared helpers.',
      { path: '^src/store/' },
      { path: '^src/(http|service|cluster|dispatch)/' },
    ),
    forbid(
      'shared-not-up',
      'The shared helpers import none of the levels.',
      { path: SHARED },
      { path: '^src/(http|service|cluster|dispatch|store|generated)/' },
    ),
    forbid(
      'core-stands-alone',
      'The pure rules (src/core/) import nothing of src/ outside src/core/: what they need is passed in.',
      { path: CORE },
      { path: '^src/', pathNot: CORE },
    ),
    forbid(
      'prisma-in-store',
      "Prisma's generated client is the store's.",
      { path: '^src/', pathNot: '^src/(store|generated)/' },
      { path: '^src/generated/' },
    ),
    forbid('sdk-stands-alone', 'The published SDK imports nothing of the broker.', { path: '^clients/typescript/src/' }, { path: '^src/' }),
    forbid(
      'sdk-for-the-cli',
      'Of the broker, only the CLI is a client of the SDK.',
      { path: '^src/', pathNot: '^src/cli/' },
      { path: '^clients/' },
    ),
    forbid(
      'relative-imports-resolve',
      'A relative import that does not resolve is invisible to the rules above (the console loads its vendored uPlot at run time).',
      { pathNot: '^src/console/' },
      { couldNotResolve: true, path: '^\\.\\.?/' },
    ),
  ],
  options: {
    parser: 'swc',
    tsPreCompilationDeps: true,
    // Imports of packages and of Prisma's generated client count; what they import in turn is not read.
    doNotFollow: { path: ['node_modules', '^src/generated/'] },
    // Resolved as Node resolves the package imports (`exports` conditions), so @hookq/client leads to
    // clients/typescript/src and the rules see the CLI's use of it.
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default'],
      extensions: ['.ts', '.js', '.mjs'],
    },
  },
}
