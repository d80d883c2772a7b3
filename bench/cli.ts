#!/usr/bin/env node
/**
 * flash-attn-bench: how fast, how much memory, compared with what you would use otherwise.
 *
 *   npx flash-attn-bench                           # the FA2 paper's grid on CUDA (a small grid on the CPU without a GPU)
 *   npx flash-attn-bench --seqlen 1k,4k --head-dim 128 --pass fwdbwd --compare torch,naive --chart out.svg
 *   npx flash-attn-bench --preset fp32-memory-wall --markdown
 *
 * The pieces: bench/args.ts (flags), bench/presets.ts, bench/grid.ts (cells), bench/runner.ts
 * (measuring), bench/torch.ts (PyTorch SDPA), bench/report.ts (tables, JSON, CSV, markdown),
 * bench/chart.ts (SVG), bench/flops.ts (FA2's FLOP count), bench/peaks.ts (% of peak).
 * @packageDocumentation
 */
import * as fs from 'fs';
import * as os from 'os';
import { SingleBar, Presets } from 'cli-progress';
import { backends, defaultDevice, emptyCache } from '../lib';
import { BenchArgError, HELP, MIN_CUDA_REPEATS, parseArgs } from './args';
import { renderChartSvg } from './chart';
import { BenchCell, buildCells } from './grid';
import { peakTflops } from './peaks';
import { listPresets } from './presets';
import {
  BenchEnv, BenchReport, cpuModel, formatCsv, formatJson, formatMarkdown, formatText, fmtMs, fmtTflops, packageVersion, presetText,
  REPORT_SCHEMA, reportSettings,
} from './report';
import { addRatios, BenchRow, kernelsRan, oursWork, resolveKernel, RunHooks, runOurs, sortRows, torchRows } from './runner';
import { openTorchWorker, TorchCellSession, TorchEnv, TorchResult, TorchWorker } from './torch';
import { packageVersionFrom } from './version';

/** Where the CLI writes; tests pass their own. */
export interface CliIO {
  stdout: NodeJS.WritableStream & { isTTY?: boolean };
  stderr: NodeJS.WritableStream & { isTTY?: boolean };
  env: NodeJS.ProcessEnv;
}

const NAME = 'flash-attn-bench';

/** The NVIDIA kernel module's version from /proc (Linux), or null. */
function nvidiaDriverVersion(): string | null {
  try {
    return /Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)/.exec(fs.readFileSync('/proc/driver/nvidia/version', 'utf8'))?.[1] ?? null;
  } catch {
    return null;
  }
}

/** A progress display: a bar on a TTY, one line per row in a log, nothing when quiet. */
interface Progress {
  total(n: number): void;
  /** `short` names the row on the bar; `long` is the log line (with the timing). */
  tick(done: number, short: string, long?: string): void;
  stop(): void;
}

function makeProgress(io: CliIO, quiet: boolean): Progress {
  if (quiet) return { total: () => undefined, tick: () => undefined, stop: () => undefined };
  if (io.stderr.isTTY) {
    const bar = new SingleBar(
      { stream: io.stderr, format: `${NAME} [{bar}] {value}/{total} {what}`, hideCursor: true, clearOnComplete: true, etaBuffer: 20 },
      Presets.shades_classic,
    );
    let started = false;
    let total = 0;
    return {
      total: (n) => {
        total = n;
        if (!started) bar.start(n, 0, { what: '' });
        else bar.setTotal(n);
        started = true;
      },
      tick: (done, short) => bar.update(Math.min(done, total), { what: short }),
      stop: () => {
        if (started) bar.stop();
        started = false;
      },
    };
  }
  let total = 0;
  return {
    total: (n) => {
      total = n;
    },
    tick: (done, short, long) => io.stderr.write(`[${done}/${total}] ${long ?? short}\n`),
    stop: () => undefined,
  };
}

function rowLine(r: BenchRow): string {
  const what = `${r.impl} ${r.id}`;
  if (r.status !== 'ok') return `${what}: ${r.status === 'oom' ? 'OOM' : r.status}${r.error ? ` (${r.error})` : ''}`;
  const ran = [r.kernel, r.algorithm].filter((x) => x !== null).join(' ');
  return `${what}: ${fmtMs(r.msMedian as number)} ms, ${fmtTflops(r.tflops as number)} TFLOP/s${ran ? ` (${ran})` : ''}`;
}

/** Where {@link torchTurns} reports to the CLI. */
interface TorchTurnsSink {
  /** The worker failed: nothing more is asked of it; `reason` says why. */
  stop(reason: string): void;
  /** PyTorch's rows of `cells` (one cell's session, or a group's untimed cells). */
  answered(result: TorchResult & { available: true }, cells: readonly BenchCell[]): void;
  /** Hands our pool's cached memory back to the driver, so that PyTorch's process can allocate it. */
  emptyPool(): Promise<void> | void;
}

/**
 * The {@link RunHooks} that time PyTorch on `worker` in turns with ours, cell by cell: our warm-ups,
 * then PyTorch's session begins (its inputs and warm-ups); our round i, then PyTorch's round i; after
 * our last round, PyTorch's end gives its rows of the cell. On CUDA both sides have the same repeats,
 * hence the same rounds; ours on the CPU backend may have fewer, and PyTorch's rounds past ours'
 * last then run back to back before its end. Our memory stays allocated meanwhile (both fit); after
 * each input group our pool's cached memory goes back to the driver, and PyTorch times, in one
 * request, the group's cells that ours did not time (no rounds to take turns with). After a failure
 * nothing more is asked.
 */
function torchTurns(worker: TorchWorker, sink: TorchTurnsSink): Pick<RunHooks, 'beforeRounds' | 'afterRound' | 'afterRounds' | 'afterGroup'> {
  /** The cell's session while it is open, and how many of its rounds have run. */
  let open: { session: TorchCellSession; roundsRun: number } | null = null;
  /** Cells whose session was asked for (ours reached their timed rounds). */
  const begun = new Set<string>();
  let stopped = false;
  const fail = (reason: string): void => {
    stopped = true;
    open = null;
    sink.stop(reason);
  };
  /** PyTorch's round `index` of the open cell, if it has one. */
  const round = async (index: number): Promise<void> => {
    if (open === null || index >= open.session.rounds.length) return;
    const done = await open.session.round(index);
    if (done.available) open.roundsRun = index + 1;
    else fail(done.reason);
  };
  return {
    beforeRounds: async (cell) => {
      if (stopped) return;
      begun.add(cell.id);
      const started = await worker.begin(cell);
      if (started.available) open = { session: started.session, roundsRun: 0 };
      else fail(started.reason);
    },
    afterRound: (_cell, index) => round(index),
    afterRounds: async (cell) => {
      while (open !== null && open.roundsRun < open.session.rounds.length) await round(open.roundsRun);
      if (open === null) return;
      const result = await open.session.end();
      open = null;
      if (result.available) sink.answered(result, [cell]);
      else fail(result.reason);
    },
    afterGroup: async (group) => {
      if (stopped) return;
      await sink.emptyPool();
      const untimed = group.filter((c) => !begun.has(c.id));
      if (untimed.length === 0) return;
      const result = await worker.run(untimed);
      if (result.available) sink.answered(result, untimed);
      else fail(result.reason);
    },
  };
}

/** Runs the CLI on `argv` (without node and the script); resolves with the exit status. */
export async function main(argv: string[], io: CliIO = { stdout: process.stdout, stderr: process.stderr, env: process.env }): Promise<number> {
  const err = (msg: string): void => {
    io.stderr.write(`${NAME}: ${msg}\n`);
  };
  // These print and exit without loading the addon.
  const infoOnly = argv.some((a) => a === '--help' || a === '-h' || a === '--version' || a === '-v' || a === '--list-presets');
  let dev: 'cpu' | 'cuda' = 'cpu';
  if (!infoOnly) {
    try {
      dev = defaultDevice();
    } catch {
      dev = 'cpu'; // the addon did not load: backends() below says why
    }
  }
  let cmd: ReturnType<typeof parseArgs>;
  try {
    cmd = parseArgs(argv, dev);
  } catch (e) {
    if (e instanceof BenchArgError) {
      err(e.message);
      return 2;
    }
    throw e;
  }
  if (cmd.kind === 'help') {
    io.stdout.write(HELP);
    return 0;
  }
  if (cmd.kind === 'version') {
    let version: string;
    try {
      version = packageVersionFrom(__dirname);
    } catch (e) {
      err(`--version: ${(e as Error).message}`);
      return 1;
    }
    io.stdout.write(`${NAME} ${version}\n`);
    return 0;
  }
  if (cmd.kind === 'list-presets') {
    io.stdout.write(listPresets());
    return 0;
  }
  const { settings: s, output: o } = cmd;

  const b = backends();
  if (!b.native.loaded) {
    err(b.native.error ?? 'the native addon did not load');
    return 1;
  }
  if (s.device === 'cuda' && !b.cuda.available) {
    err(`CUDA is not available (${b.cuda.reason}); run with --device cpu for the CPU backend`);
    return 1;
  }

  const date = new Date().toISOString();
  const gpu = b.cuda.device;
  const notes: string[] = [];
  if (s.device === 'cpu' && !cmd.deviceChosen && !b.cuda.available) {
    // Names the preset as what ran only when no flag replaced its values.
    const where = `on the CPU backend, ${b.cpu.threads} threads`;
    notes.push(`no usable GPU (${b.cuda.reason}): ` + (cmd.overrides.length === 0
      ? `ran the small CPU grid (preset ${cmd.basePreset}) ${where}`
      : `ran ${where}: ${presetText(cmd.basePreset, cmd.overrides)}`));
  }
  if (s.compare.includes('naive') && s.device === 'cpu') {
    notes.push('--compare naive: the naive kernel is CUDA-only; no naive rows on the CPU backend');
  }
  if (s.device === 'cuda' && resolveKernel(s.device, s.kernel) === 'naive' && s.kernel === 'auto' && s.compare.includes('naive')) {
    notes.push('--compare naive: "ours" is the naive kernel here, so each cell is measured once and shown in both columns');
  }
  const cells = buildCells(s);
  const peak = s.device === 'cuda' ? peakTflops(gpu?.name, s.dtype) : null;
  if (s.device === 'cuda' && peak === null) notes.push(`no peak TFLOP/s known for ${gpu?.name}: the % of peak column is blank`);

  const machine = o.json || o.csv || o.markdown;
  const tables = machine ? io.stderr : io.stdout;

  // Ours' rows, then PyTorch's: a bar on a TTY, one line per row in a log.
  const progress = makeProgress(io, o.quiet);
  let done = 0;

  // --compare torch: one PyTorch worker for the whole grid, each cell timed in turns with ours (the
  // round hooks below), so that a cell's two sides run beside the same neighbours.
  let worker: TorchWorker | null = null;
  let torchEnv: TorchEnv | null = null;
  let torchUnavailable: string | null = null;
  let torchPeak: number | null = null;
  if (s.compare.includes('torch')) {
    if (!o.quiet) io.stderr.write(`${NAME}: starting PyTorch SDPA (${s.torchBackends.join(', ')}) for ${cells.length} cells...\n`);
    const opened = await openTorchWorker({
      // PyTorch runs on CUDA even beside a CPU run of ours: at least 20 repeats there. On CUDA both
      // sides get --repeats (at least 20 there too), hence the same rounds (timedRounds).
      backends: s.torchBackends, warmup: s.warmup, warmupMs: s.warmupMs, repeats: Math.max(s.repeats, MIN_CUDA_REPEATS),
      python: o.python ?? undefined,
      // The bar moves while PyTorch times a list of cells; a log gets PyTorch's rows when they come.
      onProgress: io.stderr.isTTY ? (d) => progress.tick(done + d, 'torch') : undefined,
    });
    if (opened.available) {
      worker = opened.worker;
      torchEnv = worker.env;
      torchPeak = peakTflops(torchEnv.device, s.dtype);
    } else {
      torchUnavailable = opened.reason;
      err(`--compare torch: no PyTorch baselines: ${opened.reason}; going on without them`);
      notes.push(`--compare torch: no PyTorch baselines (${opened.reason})`);
    }
  }

  const torchPerCell = worker !== null ? s.torchBackends.length : 0;
  let total = oursWork(cells, s) + cells.length * torchPerCell;
  progress.total(total);
  /** PyTorch's side as the grid goes: its rows, the cells it answered, why it stopped (null while it serves). */
  const torch: { rows: BenchRow[]; answered: Set<string>; stopped: string | null } = { rows: [], answered: new Set(), stopped: null };

  let rows: BenchRow[];
  try {
    const onRow = (r: BenchRow): void => progress.tick(++done, `${r.impl} ${r.id}`, rowLine(r));
    rows = await runOurs(cells, s, peak, {
      onRow,
      ...(worker !== null ? torchTurns(worker, {
        stop: (reason) => {
          torch.stopped = reason;
          total -= (cells.length - torch.answered.size) * torchPerCell;
          progress.total(total);
        },
        answered: (result, answered) => {
          for (const c of answered) torch.answered.add(c.id);
          for (const r of torchRows(result, answered, torchPeak)) {
            torch.rows.push(r);
            progress.tick(++done, `${r.impl} ${r.id}`, rowLine(r));
          }
        },
        emptyPool: s.device === 'cuda' ? () => emptyCache('cuda') : () => undefined,
      }) : {}),
    });
  } finally {
    progress.stop();
    await worker?.close();
  }
  rows.push(...torch.rows);
  if (torch.stopped !== null) {
    const missing = cells.length - torch.answered.size;
    err(`--compare torch: PyTorch stopped after ${torch.answered.size} of ${cells.length} cells: ${torch.stopped}; going on without it`);
    notes.push(`--compare torch: PyTorch SDPA stopped mid-run (${torch.stopped}): ${missing} of ${cells.length} cells have no PyTorch rows`);
  }
  if (torchEnv !== null && torch.rows.length > 0 && s.device === 'cpu') {
    notes.push(`PyTorch rows ran on ${torchEnv.device} (CUDA); ours on the CPU backend`);
  }
  addRatios(rows);
  rows = sortRows(rows, cells);

  // GPU fields only where something ran on a GPU; PyTorch's only where it was asked for.
  const ranOnGpu = s.device === 'cuda' || torchEnv !== null;
  const env: BenchEnv = {
    date, version: packageVersion(), node: process.version, platform: `${process.platform}-${process.arch}`, device: s.device,
    deviceName: s.device === 'cuda' && gpu ? gpu.name : `CPU backend (${b.cpu.threads} threads)`,
    ...(ranOnGpu ? {
      computeCapability: gpu?.computeCapability ?? null,
      driver: gpu ? nvidiaDriverVersion() ?? (torchEnv?.driver && /^\d+\.\d+/.test(torchEnv.driver) ? torchEnv.driver : null) : null,
      cudaDriver: gpu?.driverVersion ?? null, cudaRuntime: gpu?.runtimeVersion ?? null,
    } : {}),
    cpu: cpuModel(), cpuThreads: os.cpus().length,
    ...(s.device === 'cpu' ? { cpuBackendThreads: b.cpu.threads } : {}),
    ...(s.compare.includes('torch') ? { torch: torchEnv, torchUnavailable } : {}),
  };
  const kernelResolved = kernelsRan(rows);
  if (s.device === 'cuda' && s.kernel === 'auto' && /naive/.test(kernelResolved)) {
    notes.push('"auto" ran the naive kernel where this build has no FlashAttention-2 CUDA kernel (the backward, for now): '
      + 'each row\'s kernel says which ran');
  }
  const report: BenchReport = {
    tool: NAME, schema: REPORT_SCHEMA, env,
    settings: reportSettings(s, {
      preset: cmd.basePreset, presetOverrides: cmd.overrides, kernelResolved, peakTflops: peak,
      timing: (s.device === 'cuda' ? 'CUDA events, runs queued back to back' : 'host time to completion')
        + (torchEnv !== null ? '; ours and PyTorch SDPA take turns round by round within each cell' : ''),
    }),
    notes, rows,
  };

  if (!(machine && o.quiet)) tables.write(formatText(report));
  if (o.json) io.stdout.write(formatJson(report));
  if (o.csv) io.stdout.write(formatCsv(report));
  if (o.markdown) io.stdout.write(formatMarkdown(report));
  if (o.chart !== null) {
    try {
      fs.writeFileSync(o.chart, await renderChartSvg(report));
      if (!o.quiet) io.stderr.write(`${NAME}: chart written to ${o.chart}\n`);
    } catch (e) {
      err(`--chart: could not write ${o.chart}: ${(e as Error).message}`);
      return 1;
    }
  }
  return rows.some((r) => r.impl === 'ours' && r.status === 'error') ? 1 : 0;
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (e: unknown) => {
      process.stderr.write(`${NAME}: ${e instanceof Error ? e.stack : String(e)}\n`);
      process.exitCode = 1;
    },
  );
}
