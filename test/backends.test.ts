/**
 * What backends() reports about the CPU backend and the build: the SIMD variant the CPU kernels run
 * must be the one this machine's CPU supports (checked against /proc/cpuinfo on x86-64 Linux), and a
 * CPU-only build's CUDA reason must be the one its build recorded.
 */
import * as fs from 'fs';

import { backends, CpuSimd } from '../lib';
import { binding, cpuOnlyReasonText } from '../lib/native';

const SIMD_VALUES: readonly CpuSimd[] = ['avx512', 'avx2', 'generic'];

/** The variant csrc/cpu/cpu_isa.h's detection picks for these CPU flags (as /proc/cpuinfo lists them). */
function expectedSimd(flags: Set<string>): CpuSimd {
  const avx2 = flags.has('avx2') && flags.has('fma') && flags.has('f16c');
  if (avx2 && flags.has('avx512f')) return 'avx512';
  return avx2 ? 'avx2' : 'generic';
}

/** The flags of the first processor in /proc/cpuinfo, or null where there is no such file. */
function cpuinfoFlags(): Set<string> | null {
  if (process.platform !== 'linux' || !fs.existsSync('/proc/cpuinfo')) return null;
  const line = fs.readFileSync('/proc/cpuinfo', 'utf8').split('\n').find((l) => /^flags\s*:/.test(l));
  return line ? new Set(line.slice(line.indexOf(':') + 1).trim().split(/\s+/)) : null;
}

describe('backends().cpu.simd', () => {
  test('is one of the variants, and the one the addon reports', () => {
    const cpu = backends().cpu;
    expect(cpu.available).toBe(true);
    expect(SIMD_VALUES).toContain(cpu.simd);
    expect(cpu.simd).toBe(binding().cpuSimd);
  });

  const flags = process.arch === 'x64' ? cpuinfoFlags() : null;
  (flags ? test : test.skip)('is the widest variant this CPU supports (x86-64 Linux: /proc/cpuinfo flags)', () => {
    expect(backends().cpu.simd).toBe(expectedSimd(flags!));
  });
  if (!flags) {
    test.skip(`SIMD detection check: skipped because it reads /proc/cpuinfo's x86 flags and this is ${process.platform}-${process.arch}`,
      () => undefined);
  }

  (process.arch !== 'x64' && process.arch !== 'ia32' ? test : test.skip)('is generic off x86 (the only variant built there)', () => {
    expect(backends().cpu.simd).toBe('generic');
  });

  test('the detection rule matches the flags each variant needs', () => {
    expect(expectedSimd(new Set(['sse2']))).toBe('generic');
    expect(expectedSimd(new Set(['avx2', 'fma']))).toBe('generic');
    expect(expectedSimd(new Set(['avx2', 'fma', 'f16c']))).toBe('avx2');
    expect(expectedSimd(new Set(['avx512f', 'avx2', 'fma', 'f16c']))).toBe('avx512');
  });
});

describe('backends().cuda for the build', () => {
  const compiled = binding().cudaCompiled;

  (compiled ? test : test.skip)('a CUDA build records no CPU-only reason', () => {
    expect(binding().cpuOnlyReason).toBeNull();
    expect(backends().cuda.compiled).toBe(true);
  });

  (compiled ? test.skip : test)('a CPU-only build reports the reason its build recorded', () => {
    const reason = binding().cpuOnlyReason;
    expect(['disabled', 'nvcc-not-found', 'cudart-not-found', 'unknown']).toContain(reason);
    const cuda = backends().cuda;
    expect(cuda).toMatchObject({ available: false, compiled: false, kernels: [] });
    expect(cuda.reason).toBe(cpuOnlyReasonText(reason));
  });
});
