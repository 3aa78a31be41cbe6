/** Schemas of the API keys resource (POST/GET /v1/keys, DELETE /v1/keys/{id}). */
import { Type } from 'typebox'
import { ref } from './common.ts'

const Patterns = (what: string) =>
  Type.Optional(
    Type.Array(Type.String({ minLength: 1, maxLength: 250 }), {
      minItems: 1,
      maxItems: 100,
      description: `${what} this scope covers: names, or prefixes ending in * (leave out for all)`,
    }),
  )

export const KeyScope = Type.Object(
  {
    action: Type.Union([Type.Literal('produce'), Type.Literal('consume'), Type.Literal('admin'), Type.Literal('metrics')], {
      description: 'produce, consume, admin (covers the others but metrics), or metrics (GET /metrics)',
    }),
    topics: Patterns('Topics'),
    groups: Patterns('Groups'),
  },
  { $id: 'KeyScope', additionalProperties: false },
)

export const KeyCreate = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 200, description: 'What the key is for' }),
    scopes: Type.Array(ref(KeyScope), { minItems: 1, maxItems: 100 }),
    expiresAt: Type.Optional(Type.String({ format: 'date-time', description: 'After this the key gets 401' })),
  },
  { $id: 'KeyCreate', additionalProperties: false },
)

export const Key = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    scopes: Type.Array(ref(KeyScope)),
    createdAt: Type.String({ format: 'date-time' }),
    expiresAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
  },
  { $id: 'Key' },
)

export const CreatedKey = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    key: Type.String({ description: 'The bearer key: in this answer only; the broker keeps only its hash' }),
    scopes: Type.Array(ref(KeyScope)),
    createdAt: Type.String({ format: 'date-time' }),
    expiresAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
  },
  { $id: 'CreatedKey' },
)

export const KeyList = Type.Object({ keys: Type.Array(ref(Key)) }, { $id: 'KeyList' })

export const KeyParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 100, description: 'Key id' }) })

export const keySchemas = [KeyScope, KeyCreate, Key, CreatedKey, KeyList]
