/**
 * Request validation with two Ajv instances. Bodies are validated strictly: no type coercion and no
 * silent removal of unknown fields ("4" is not a partition count; a misspelt field is an error, not
 * ignored). Params and query strings arrive as text, so those get type coercion.
 *
 * Two rules hold for every schema, so no route can forget them:
 * - No string may contain NUL (U+0000): PostgreSQL text cannot hold it, and a NUL that reached a
 *   query was a 500. Every `type: "string"` schema gets the `noNul` keyword, unless it says
 *   `"x-allow-nul": true` (header values: stored inside JSON text, where NUL is escaped). Free JSON
 *   (a message value) has no string schema and keeps its NULs.
 * - An integer in a path or query string is plain decimal digits: Ajv coerces text as Number()
 *   does, so "0x10", "+1", "00", " 1" and "1e0" would otherwise name numbers.
 */
import { _, Ajv, type KeywordCxt, type Options, type ValidateFunction } from 'ajv'
import addFormatsModule from 'ajv-formats'
import type { FastifySchemaCompiler } from 'fastify'
import type { LazyCompiles } from './lazy-compile.ts'
import { ALLOW_NUL } from './schemas/common.ts'

// ajv-formats is CommonJS; under ESM its function may sit on .default.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (ajv: Ajv) => void

const base: Options = { useDefaults: true, removeAdditional: false, allErrors: false, strict: false }

function makeAjv(options: Options, schemas: unknown[]): Ajv {
  const ajv = new Ajv({ ...base, ...options })
  addFormats(ajv)
  ajv.addKeyword({
    keyword: 'noNul',
    type: 'string',
    schemaType: 'boolean',
    error: { message: 'must not contain NUL (\\u0000)' },
    code(cxt: KeywordCxt) {
      if (cxt.schema === true) cxt.fail(_`${cxt.data}.indexOf(String.fromCharCode(0)) !== -1`)
    },
  })
  for (const s of schemas) ajv.addSchema(withNoNul(s) as object)
  return ajv
}

/** A copy of the schema with `noNul: true` on every string schema that does not allow NUL. */
export function withNoNul(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(withNoNul)
  if (schema === null || typeof schema !== 'object') return schema
  const node = schema as Record<string, unknown>
  const out: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(node))
    out[k] = k === 'const' || k === 'enum' || k === 'default' || k === 'examples' ? v : withNoNul(v)
  const types = Array.isArray(node.type) ? node.type : [node.type]
  if (types.includes('string') && node[ALLOW_NUL] !== true) out.noNul = true
  return out
}

const DECIMAL = /^(0|-?[1-9][0-9]*)$/

/** The names of the properties a params or querystring schema types as integers. */
function integerFields(schema: unknown): string[] {
  const props = (schema as { properties?: Record<string, { type?: unknown }> } | null)?.properties ?? {}
  return Object.entries(props)
    .filter(([, s]) => s.type === 'integer')
    .map(([name]) => name)
}

/**
 * Wraps a params or querystring validator: the integer fields must be written in plain decimal
 * before Ajv coerces them. The same contract as the Ajv function (boolean, `.errors`).
 */
function decimalOnly(validate: ValidateFunction, fields: string[], part: string): ValidateFunction {
  let own: ValidateFunction['errors'] = null
  const wrapper = ((data: unknown, ctx?: unknown) => {
    own = null
    const record = data !== null && typeof data === 'object' ? (data as Record<string, unknown>) : {}
    for (const field of fields) {
      const raw = record[field]
      const texts = Array.isArray(raw) ? raw : [raw]
      if (texts.some((v) => typeof v === 'string' && !DECIMAL.test(v))) {
        own = [
          {
            instancePath: `/${field}`,
            schemaPath: `#/properties/${field}/type`,
            keyword: 'decimal',
            params: {},
            message: `must be an integer in plain decimal digits (the ${part} had ${JSON.stringify(raw)})`,
          },
        ]
        return false
      }
    }
    return (validate as (d: unknown, c?: unknown) => boolean)(data, ctx)
  }) as unknown as ValidateFunction
  Object.defineProperty(wrapper, 'errors', { get: () => own ?? validate.errors, set: () => {} })
  Object.defineProperty(wrapper, 'schemaEnv', { value: validate.schemaEnv })
  return wrapper
}

/** A Fastify validator compiler that knows the shared named schemas. */
export function validatorCompiler(schemas: unknown[], compiles?: LazyCompiles): FastifySchemaCompiler<unknown> {
  const strict = makeAjv({ coerceTypes: false }, schemas)
  const coercing = makeAjv({ coerceTypes: 'array' }, schemas)
  return ({ schema, httpPart }) => {
    const compile = () => {
      const ajv = httpPart === 'body' ? strict : coercing
      const validate = ajv.compile(withNoNul(schema) as object)
      const fields = httpPart === 'params' || httpPart === 'querystring' ? integerFields(schema) : []
      return fields.length > 0 ? decimalOnly(validate, fields, httpPart === 'params' ? 'path' : 'query') : validate
    }
    return (compiles ? compiles.validator(compile) : compile()) as ReturnType<FastifySchemaCompiler<unknown>>
  }
}
