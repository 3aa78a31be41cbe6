/** Schemas shared by every resource: problem details, names, and the $ref helper. */
import { Type } from 'typebox'

// The $ref helper and the name pattern live in a leaf below the HTTP layer (the group settings
// table builds schemas with them too); every HTTP schema takes them from here.
import { NAME_PATTERN, ref } from '../../core/json-schema.ts'

export { NAME_PATTERN, ref }

/**
 * The keyword that lets one string schema accept NUL (U+0000); every other string schema refuses
 * it (src/http/validation.ts), since PostgreSQL text cannot hold it.
 */
export const ALLOW_NUL = 'x-allow-nul'

// Bounds of the database columns: a partition is an int4, an offset a bigint read into a JS number.
export const MAX_PARTITION = 2_147_483_647
export const MAX_OFFSET = Number.MAX_SAFE_INTEGER

export const Problem = Type.Object(
  {
    type: Type.String({ description: 'URI naming the problem type' }),
    title: Type.String(),
    status: Type.Integer(),
    detail: Type.String(),
    code: Type.String({ description: 'Stable machine-readable error code, e.g. topic_not_found' }),
    instance: Type.Optional(Type.String()),
    errors: Type.Optional(
      Type.Array(
        Type.Object({
          path: Type.String({ description: 'JSON pointer into the request part' }),
          message: Type.String(),
        }),
        { description: 'Each validation failure, for invalid_request' },
      ),
    ),
    index: Type.Optional(Type.Integer({ description: 'The offending message of a produce call' })),
  },
  { $id: 'Problem', description: 'RFC 9457 problem details', additionalProperties: true },
)

/** Response entries for error statuses, all answered as application/problem+json. */
export function problems(...statuses: number[]): Record<number, unknown> {
  const out: Record<number, unknown> = {}
  // Every authenticated route can also answer 403 (key without the scope) and 429 (rate limit).
  const all = statuses.includes(401) ? [...new Set([...statuses, 403, 429])].sort((x, y) => x - y) : statuses
  for (const status of all) {
    out[status] = {
      description: PROBLEM_DESCRIPTIONS[status] ?? 'Error',
      content: { 'application/problem+json': { schema: ref(Problem) } },
    }
  }
  return out
}

const PROBLEM_DESCRIPTIONS: Record<number, string> = {
  400: 'The request is not valid',
  401: 'Authentication required',
  403: 'The API key lacks the scope this call needs',
  404: 'Not found',
  409: 'Conflict with the current state',
  413: 'Too large',
  415: 'Unsupported media type',
  429: 'Too many requests; retry after the Retry-After header',
  503: 'Overloaded or unavailable; retry after the Retry-After header',
}

export const sharedSchemas = [Problem]
