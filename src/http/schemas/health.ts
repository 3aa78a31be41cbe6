/** Schemas of liveness and readiness. */
import { Type } from 'typebox'

export const Health = Type.Object(
  {
    status: Type.Union([Type.Literal('ok'), Type.Literal('unavailable')]),
    checks: Type.Optional(Type.Record(Type.String(), Type.String())),
  },
  { $id: 'Health' },
)

export const healthSchemas = [Health]
