// GPU smoke: CUDA naive vs CPU flash on random inputs.
const fa = require('../dist/lib');
console.log(JSON.stringify(fa.backends().cuda));
const rnd = (n) => new Float32Array(n).map(() => Math.random() * 2 - 1);
(async () => {
  for (const [B, Sq, Sk, H, Hk, D, causal, dtype] of [[2, 97, 203, 4, 2, 64, false, 'float32'], [1, 1025, 1023, 8, 1, 128, true, 'bfloat16'], [1, 300, 100, 2, 2, 40, true, 'float16']]) {
    const q = rnd(B * Sq * H * D), k = rnd(B * Sk * Hk * D), v = rnd(B * Sk * Hk * D), d = rnd(B * Sq * H * D);
    const res = {};
    for (const device of ['cpu', 'cuda']) {
      const mk = (x, s) => fa.Tensor.fromFloat32Array(x, s, { dtype, device });
      const Q = mk(q, [B, Sq, H, D]), K = mk(k, [B, Sk, Hk, D]), V = mk(v, [B, Sk, Hk, D]), dO = mk(d, [B, Sq, H, D]);
      const f = fa.flashAttention(Q, K, V, { causal });
      const g = fa.flashAttentionBackward(dO, Q, K, V, f.out, f.lse, { causal });
      res[device] = { out: await f.out.toFloat32Array(), lse: await f.lse.toFloat32Array(), dq: await g.dq.toFloat32Array(), dk: await g.dk.toFloat32Array(), dv: await g.dv.toFloat32Array() };
      for (const t of [Q, K, V, dO, f.out, f.lse, g.dq, g.dk, g.dv]) t.dispose();
    }
    const diff = {};
    for (const key of Object.keys(res.cpu)) {
      let m = 0, s = 0;
      for (let i = 0; i < res.cpu[key].length; i++) {
        const a = res.cpu[key][i], b = res.cuda[key][i];
        if (a === b) continue;
        m = Math.max(m, Math.abs(a - b)); s = Math.max(s, Math.abs(a));
      }
      diff[key] = `${m.toExponential(2)} / max ${s.toExponential(2)}`;
    }
    console.log(B, Sq, Sk, H, Hk, D, causal, dtype, JSON.stringify(diff));
  }
  await fa.synchronize('cuda');
  console.log(JSON.stringify(fa.memory()));
})().catch((e) => { console.error('SMOKE FAIL', e); process.exit(1); });
