/**
 * What the HTTP routes call: the services, as src/broker.ts wires them. Declared here, below both,
 * so the routes (and app.ts) depend on the services and not on the wiring that builds the app.
 */
import type { Metrics } from '../metrics.ts'
import type { AckService } from './acks.ts'
import type { GroupService } from './groups.ts'
import type { KeyService } from './keys.ts'
import type { JwksService } from './jwks.ts'
import type { OperationsService } from './operations.ts'
import type { ProduceService } from './produce.ts'
import type { ReadService } from './read.ts'
import type { ScheduleService } from './schedules.ts'
import type { TopicService } from './topics.ts'

export interface Services {
  topics: TopicService
  produce: ProduceService
  read: ReadService
  groups: GroupService
  acks: AckService
  /** Keys made with POST /v1/keys. */
  keys: KeyService
  operations: OperationsService
  schedules: ScheduleService
  metrics: Metrics
  /** The public keys of push JWTs (GET /.well-known/jwks.json). */
  jwks: JwksService
  /** Messages outstanding (pushed or waiting for a retry) on a group's partition. */
  inFlight(groupId: number, partition: number): number
  /** Named checks, each 'ok' or what is wrong. */
  readiness(): Promise<Record<string, string>>
}
