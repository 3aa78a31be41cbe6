/**
 * JSON Schema pieces used below the HTTP layer as well as in it: the $ref helper and the name
 * pattern. A leaf (it imports only TypeBox), so src/core/group-settings.ts can build the group schemas
 * the service and the CLI derive from without importing src/http. src/http/schemas/common.ts
 * re-exports both for the HTTP schemas.
 */
import { Type, type Static, type TSchema } from 'typebox'

/**
 * A reference to a named component schema. Routes refer to named schemas (registered once with
 * addSchema) so the OpenAPI document has components an SDK generator can name, not inline shapes.
 */
export function ref<T extends TSchema>(schema: T): T {
  const id = (schema as { $id?: string }).$id
  if (!id) throw new Error('ref() needs a schema with an $id')
  return Type.Unsafe<Static<T>>({ $ref: `${id}#` }) as unknown as T
}

// The contract's name pattern, less "." and "..": URL-normalising clients turn /v1/topics/.. into
// /v1, so such a resource could be created but never reached again by most clients.
export const NAME_PATTERN = '^(?!\\.{1,2}$)[A-Za-z0-9._-]{1,249}$'
