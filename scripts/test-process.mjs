// `node --import=./scripts/test-process.mjs`: preloaded into every test process (tap's node-arg in
// package.json), after tap's own preloads. tap loads its recorder, @tapjs/processinfo, into each
// test process whatever its configuration, and the recorder hooks child_process so that every
// process a test starts loads it too: there it records each of the ~500 modules a broker or the CLI
// loads and writes them out at exit, for coverage and `tap --changed`, which this project does not
// use (coverage is disabled). That cost ~0.8 s of CPU per broker started and stopped (2.9-3.3 s
// against 2.2 s), more in a longer-lived one. Emptying the hook's listeners (the singleton of
// process-on-spawn, through which the recorder adds itself to a child's NODE_OPTIONS) starts those
// processes as a user starts them. (The test process's own recording stays: tap's runner sets its
// exclusion pattern for every test process, and it costs ~0.5 s of CPU in a file that builds a broker.)
const spawnHooks = globalThis[Symbol.for('process-on-spawn@*:singletonId')]
if (spawnHooks) spawnHooks.listeners = []
