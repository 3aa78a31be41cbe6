/**
 * Schemas compiled at a route's first use, not at start-up.
 *
 * Fastify compiles a validator for every request part and a serializer for every response code of
 * every route when the app gets ready: with ~50 routes that was about a third of a broker's start-up
 * CPU (Ajv and fast-json-stringify, ~0.45 s of ~1.3 s), paid again by each process of a
 * HOOKQ_PROCESSES broker and at every restart, though most routes of a process are never called.
 * Here each compile waits for its first call; the function returned keeps the contract Fastify
 * reads (a validator's `errors` after a `false`). `compileAll` builds every one at once, so a test
 * still finds a schema that does not compile without calling its route.
 */
import SerializerSelector from '@fastify/fast-json-stringify-compiler'

type Compiled = (data: unknown, context?: never) => unknown

/** Every lazy compile made for an app, so that a test can force them all. */
export class LazyCompiles {
  private readonly pending = new Set<() => unknown>()
  private done = 0

  /**
   * A validator compiled at its first call. It keeps what Fastify reads off an Ajv function: the
   * `errors` after a `false`, and `schemaEnv`, with which Fastify passes the parent data Ajv needs
   * to change a root value (read at validation time, when the function is compiled anyway).
   */
  validator<F extends Compiled & { errors?: unknown; schemaEnv?: unknown }>(compile: () => F): F {
    const { call, compiled, force } = this.lazy(compile)
    Object.defineProperty(call, 'errors', { get: () => compiled()?.errors ?? null, set: () => {} })
    Object.defineProperty(call, 'schemaEnv', { get: () => force().schemaEnv })
    return call
  }

  /** A serializer compiled at its first call. */
  serializer<F extends Compiled>(compile: () => F): F {
    return this.lazy(compile).call
  }

  /** How many have been compiled so far. */
  get compiled(): number {
    return this.done
  }

  /** Compiles every schema not compiled yet; throws the first compile error. */
  compileAll(): number {
    for (const force of this.pending) force()
    return this.pending.size
  }

  /**
   * A function that compiles at its first call and forwards every call to the result. Fixed
   * parameters (the data, and a validator's context), not a rest parameter, which would allocate an
   * array at every request.
   */
  private lazy<F extends Compiled>(compile: () => F): { call: F; compiled: () => F | undefined; force: () => F } {
    let fn: F | undefined
    const force = (): F => {
      if (fn === undefined) {
        fn = compile()
        this.done++
      }
      return fn
    }
    this.pending.add(force)
    return { call: ((data: unknown, context?: never) => (fn ?? force())(data, context)) as F, compiled: () => fn, force }
  }
}

/** Fastify's own serializer factory (fast-json-stringify), each serializer built at its first use. */
export function lazySerializerFactory(compiles: LazyCompiles) {
  const eager = SerializerSelector()
  return (externalSchemas: unknown, options: unknown) => {
    const compiler = eager(externalSchemas as never, options as never)
    return (route: Parameters<typeof compiler>[0]) => compiles.serializer(() => compiler(route))
  }
}
