/**
 * @hookq/client: the typed client and its error (client.ts), bulk produce and the replay of dead
 * letters (dlq.ts). This file only gathers them: the modules import client.ts, never this file,
 * so none of them imports itself back through it.
 */
export * from './client.ts'

export {
  BatchProduceError,
  DLQ_HEADERS,
  deadLetterOrigin,
  produceInBatches,
  replayDeadLetters,
  replayIdempotencyKey,
  withRetries,
  type BatchOptions,
  type DeadLetterOrigin,
  type ReplayOptions,
  type ReplayProgress,
  type ReplaySkip,
  type ReplaySummary,
  type RetryOptions,
} from './dlq.ts'
