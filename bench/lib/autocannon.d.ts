// autocannon ships no types and package.json must not change (no @types/autocannon): declare the
// small part of its programmatic API the load worker uses, so `npm run typecheck` covers bench/.
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events'

  interface Options {
    url: string
    method?: string
    connections?: number
    pipelining?: number
    /** Seconds. */
    duration?: number
    /** Seconds. */
    timeout?: number
    headers?: Record<string, string>
    body?: string | Buffer
  }

  interface Result {
    errors: number
    timeouts: number
    non2xx: number
    statusCodeStats: Record<string, { count: number }>
  }

  interface Instance extends EventEmitter, PromiseLike<Result> {
    /** Takes effect at autocannon's next 1 s sample tick. */
    stop(): void
  }

  function autocannon(opts: Options): Instance
  export default autocannon
}
