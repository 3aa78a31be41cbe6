// Preloaded into every test process, before anything else (package.json's tap `test-env` puts it in
// NODE_OPTIONS, whose imports run before tap's own). tap loads its recorder, @tapjs/processinfo,
// into each test process whatever its configuration. The recorder reads every module a process
// loads a second time and measures its lines, for coverage and `tap --changed`, and it hooks
// child_process so that every process a test starts loads it too. With coverage off (the default
// here: `disable-coverage`, which tap passes on as _TAPJS_PROCESSINFO_COVERAGE_=0), before it loads:
// - its exclusion pattern matches every file, so the test process records nothing (~0.5 s of CPU in
//   a file that builds a broker: 4.1-4.3 s against 3.6-3.8 s);
// - the hook it spawns through (process-on-spawn's singleton) is made in advance, as one that never
//   wraps child_process, so the brokers, CLI runs and consumers a test starts run as a user runs
//   them (with the recorder, a broker's start and stop took ~0.8 s more CPU: 2.9-3.3 s against 2.2 s).
// With coverage on (`npx tap --no-disable-coverage ...`), the recorder is left alone.
// NODE_OPTIONS is cleared either way, so that processes started with the test's environment do not load this.
if (process.env._TAPJS_PROCESSINFO_COVERAGE_ === '0') {
  process.env._TAPJS_PROCESSINFO_EXCLUDE_ = '/./'
  Object.defineProperty(globalThis, Symbol.for('process-on-spawn@*:singletonId'), {
    writable: true,
    value: { version: 1, listeners: [], unwrap: () => {} },
  })
}
delete process.env.NODE_OPTIONS

// HOOKQ_TEST_CPU_LOG=<file>: each test process appends a line when it exits: its file, wall seconds,
// and CPU seconds (user + sys) of itself and of the processes it started and reaped (brokers, CLIs),
// from /proc/self/stat. `node scripts/test-cpu.mjs <file>` sums and sorts them: where the suite's
// CPU goes, file by file.
const cpuLog = process.env.HOOKQ_TEST_CPU_LOG
if (cpuLog) {
  const { relative } = await import('node:path')
  const { cpuNow, logCpu } = await import('./test-cpu-log.mjs')
  process.on('exit', () => {
    try {
      logCpu(cpuLog, relative(process.cwd(), process.argv[1] ?? '?'), { wall: 0, self: 0, children: 0 }, cpuNow())
    } catch {}
  })
}
