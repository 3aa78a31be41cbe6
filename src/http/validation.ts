/**
 * Request validation with two Ajv instances. Bodies are validated strictly: no type coercion and no
 * silent removal of unknown fields ("4" is not a partition count; a misspelt field is an error, not
 * ignored). Params and query strings arrive as text, so those get type coercion.
 */
import { Ajv, type Options } from 'ajv'
import addFormatsModule from 'ajv-formats'
import type { FastifySchemaCompiler } from 'fastify'

// ajv-formats is CommonJS; under ESM its function may sit on .default.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (ajv: Ajv) => void

const base: Options = { useDefaults: true, removeAdditional: false, allErrors: false, strict: false }

function makeAjv(options: Options, schemas: unknown[]): Ajv {
  const ajv = new Ajv({ ...base, ...options })
  addFormats(ajv)
  for (const s of schemas) ajv.addSchema(s as object)
  return ajv
}

/** A Fastify validator compiler that knows the shared named schemas. */
export function validatorCompiler(schemas: unknown[]): FastifySchemaCompiler<unknown> {
  const strict = makeAjv({ coerceTypes: false }, schemas)
  const coercing = makeAjv({ coerceTypes: 'array' }, schemas)
  return ({ schema, httpPart }) => {
    const ajv = httpPart === 'body' ? strict : coercing
    return ajv.compile(schema as object) as ReturnType<FastifySchemaCompiler<unknown>>
  }
}
