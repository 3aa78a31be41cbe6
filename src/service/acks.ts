/**
 * The rules of acknowledgement at the service boundary: the group must exist; the cluster does the
 * rest (it hands each call to this process's dispatcher, or answers 503 while a group is still
 * loading here; src/cluster/cluster.ts).
 */
import type { Cluster } from '../cluster/cluster.ts'
import type { AckStatus } from '../dispatch/dispatcher.ts'
import type { Metrics } from '../metrics.ts'
import type { GroupService } from './groups.ts'

type Results = Promise<{ deliveryId: string; status: AckStatus }[]>

export class AckService {
  constructor(
    private readonly groups: GroupService,
    private readonly cluster: Pick<Cluster, 'hasGroup' | 'ack' | 'nack' | 'extend'>,
    private readonly metrics?: Pick<Metrics, 'acked'>,
  ) {}

  /** 404 for a group that does not exist; the dispatcher knows the running ones without a query. */
  private async requireGroup(group: string): Promise<void> {
    if (!this.cluster.hasGroup(group)) await this.groups.get(group)
  }

  /** Completes the deliveries' messages; answered once durable. */
  async ack(group: string, deliveryIds: string[]): Results {
    await this.requireGroup(group)
    return this.counted(group, await this.cluster.ack(group, deliveryIds))
  }

  /** Fails the deliveries' current attempts. */
  async nack(group: string, deliveryIds: string[], delayMs: number | undefined, deadLetter: boolean): Results {
    await this.requireGroup(group)
    return this.counted(group, await this.cluster.nack(group, deliveryIds, delayMs, deadLetter))
  }

  /** Moves ack deadlines. */
  async extend(group: string, deliveryIds: string[], extendMs: number): Results {
    await this.requireGroup(group)
    return this.counted(group, await this.cluster.extend(group, deliveryIds, extendMs))
  }

  private counted(group: string, results: Awaited<Results>): Awaited<Results> {
    for (const r of results) this.metrics?.acked(group, r.status)
    return results
  }
}
