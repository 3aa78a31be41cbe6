/**
 * The outbox's idle looks taken in turns (src/service/outbox.ts nextTurnMs): N processes, each
 * scheduling its next look from its last, look once per poll between them, in the order of their
 * places, never two in one slot and never one twice in a row.
 */
import t from '../helpers/tap.ts'
import { nextTurnMs } from '../../src/service/outbox.ts'

t.test("the next start of a process's own slot", async (t) => {
  t.equal(nextTurnMs(1000, 50, 0, 4), 1200, 'slot 0 of 4: every 200 ms from 0')
  t.equal(nextTurnMs(1000, 50, 1, 4), 1050, 'slot 1: 50 ms past the 200 ms period')
  t.equal(nextTurnMs(1000, 50, 3, 4), 1150)
  t.equal(nextTurnMs(1050, 50, 1, 4), 1250, 'at its slot start: the next one, not the same again')
  t.equal(nextTurnMs(1049.5, 50, 1, 4), 1250, 'less than 1 ms before it: the next one too')
  t.equal(nextTurnMs(1000, 50, 0, 1), 1050, 'alone: every poll')
  t.equal(nextTurnMs(1000, 50, 5, 4), nextTurnMs(1000, 50, 1, 4), 'a place past the count (a stale view) wraps')
})

t.test('N processes look once per poll between them', async (t) => {
  for (const count of [2, 3, 4, 7]) {
    const looks: { at: number; index: number }[] = []
    for (let index = 0; index < count; index++) {
      // Each starts at its own moment and schedules its next look from the last (a look takes 3 ms).
      let at = 17 * index + 3
      while (at < 10_000) {
        at = nextTurnMs(at + 3, 50, index, count)
        looks.push({ at, index })
      }
    }
    looks.sort((a, b) => a.at - b.at)
    const inRange = looks.filter((l) => l.at >= 1000 && l.at < 9000)
    t.equal(inRange.length, 8000 / 50, `${count} processes: one look per 50 ms`)
    t.ok(
      inRange.every((l, i) => i === 0 || (l.at - inRange[i - 1]!.at === 50 && l.index === (inRange[i - 1]!.index + 1) % count)),
      `${count} processes: 50 ms apart, in turn`,
    )
  }
})
