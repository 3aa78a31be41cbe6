import { runGroup } from '../helpers/group.ts'

await runGroup(import.meta.url)
