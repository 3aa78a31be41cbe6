/**
 * Every error hookq answers with, in one table: a stable machine-readable code, its HTTP status and
 * title. Services throw HookqError; the HTTP error handler turns it into RFC 9457 problem details.
 */

export const ERRORS = {
  invalid_request: { status: 400, title: 'The request is not valid' },
  invalid_json: { status: 400, title: 'The request body is not valid JSON' },
  too_many_messages: { status: 400, title: 'Too many messages in one call' },
  invalid_cursor: { status: 400, title: 'The cursor is not one this API issued' },
  url_not_allowed: { status: 400, title: 'The URL is not allowed by the push URL policy' },
  offset_out_of_range: { status: 400, title: 'The offset is beyond the end of the partition' },
  unauthorized: { status: 401, title: 'Authentication required' },
  forbidden: { status: 403, title: 'The API key lacks the scope this call needs' },
  topic_not_found: { status: 404, title: 'Topic not found' },
  partition_not_found: { status: 404, title: 'Partition not found' },
  group_not_found: { status: 404, title: 'Consumer group not found' },
  consumer_not_found: { status: 404, title: 'Consumer not found' },
  key_not_found: { status: 404, title: 'API key not found' },
  schedule_not_found: { status: 404, title: 'Schedule not found' },
  route_not_found: { status: 404, title: 'No such route' },
  method_not_allowed: { status: 405, title: 'Method not allowed' },
  topic_conflict: { status: 409, title: 'Topic exists with a different configuration' },
  group_conflict: { status: 409, title: 'Group exists with a different topic' },
  pull_group: { status: 409, title: 'The group is a pull group: it has no consumers' },
  group_has_consumers: { status: 409, title: 'The group has consumers: a pull group has none' },
  push_group: { status: 409, title: 'The group is a push group: its messages are pushed, not pulled' },
  message_too_large: { status: 413, title: 'Message too large' },
  body_too_large: { status: 413, title: 'Request body too large' },
  uri_too_long: { status: 414, title: 'URI too long' },
  unsupported_media_type: { status: 415, title: 'Unsupported media type' },
  rate_limited: { status: 429, title: 'Too many requests for this API key or client' },
  too_many_pulls: { status: 429, title: 'Too many pull calls are waiting on this broker process' },
  overloaded: { status: 503, title: 'The broker is overloaded' },
  unavailable: { status: 503, title: 'The broker cannot serve this request now' },
  internal: { status: 500, title: 'Internal error' },
  outcome_unknown: { status: 500, title: 'The outcome of the write is unknown' },
} as const satisfies Record<string, { status: number; title: string }>

export type ErrorCode = keyof typeof ERRORS

/** A failure that belongs to the caller's request, with the code the client can act on. */
export class HookqError extends Error {
  override name = 'HookqError'
  readonly status: number
  readonly title: string
  /** Seconds a client should wait before trying again (429/503). */
  readonly retryAfterS: number | undefined
  /** Extra members for the problem document (e.g. the index of the offending message). */
  readonly extra: Record<string, unknown> | undefined

  constructor(
    readonly code: ErrorCode,
    detail: string,
    opts: { retryAfterS?: number; extra?: Record<string, unknown>; cause?: unknown } = {},
  ) {
    super(detail, opts.cause === undefined ? undefined : { cause: opts.cause })
    this.status = ERRORS[code].status
    this.title = ERRORS[code].title
    this.retryAfterS = opts.retryAfterS
    this.extra = opts.extra
  }
}

/** The problem-details `type` URI for a code. */
export function problemType(code: string): string {
  return `urn:hookq:problem:${code}`
}
