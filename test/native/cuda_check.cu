// GPU check of the naive CUDA reference attention (csrc/cuda/naive_attention.cu) and the test fill
// (csrc/cuda/fill.cu). Built and run by scripts/cuda-check.sh on a machine with a GPU:
//     cuda_check [seed] [--quick]
// For every case: fresh random inputs (never zero; rounded to the dtype with common/half.h; the seed is
// printed, pass it back to reproduce), outputs poisoned with NaN, forward then backward (fed the GPU
// forward's out and lse) on a non-blocking stream, compared with a float64 host reference computed from
// the same rounded inputs: max |gpu - ref| / max(max |ref|, kRefFloor) <= 1e-4 (f32) or 1e-2 (f16, bf16)
// for out, dq, dk, dv, and <= kLseTol relative for lse (always fp32). Also checked: every output element
// written (no NaN left), padding of strided outputs untouched, empty causal rows give out 0, lse +inf and
// dq 0, the backward is bit-identical when run twice, the workspace comes back to the memory pool, and
// the pool's high watermark covers the advertised workspace size. Two large cases (skipped by --quick)
// check sampled rows: one whose S has more than 2^31 elements (64-bit indexing), and the benchmark
// shape (B 4, H 1, S 8192, D 64, fp32), which is also timed with cudaEvents.
// One PASS/FAIL line per case; exit status 1 on any failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/attention_params.h"
#include "common/dtype.h"
#include "common/half.h"
#include "cuda/fill.h"
#include "cuda/naive_attention.h"
#include "check_cuda.h"


namespace {

using fa::DType;

constexpr double kTolF32 = 1e-4;   // out / dq / dk / dv, float32
constexpr double kTolHalf = 1e-2;  // out / dq / dk / dv, float16 and bfloat16
constexpr double kLseTol = 1e-4;   // lse is fp32 whatever the dtype; relative to max(max |lse|, 1)
// Denominator floor of the relative error: a tensor that is 0 in exact arithmetic (dq and dk at
// seqlen_k 1, where dS = P (dP - D) cancels) is compared in absolute terms instead.
constexpr double kRefFloor = 1e-2;
// Inputs: magnitude uniform in [kMinMag, max], random sign (never zero). q and k get the wider range
// so the softmax is not flat.
constexpr double kMinMag = 0.1;
constexpr double kQkMaxMag = 1.5;
constexpr double kVoMaxMag = 1.0;
// Stored in the padding of strided inputs: reading it by mistake would show in every result.
constexpr float kInputPadValue = 1000.0f;
// Rows checked in the large (sampled) cases, besides the corner rows.
constexpr int kRandomSampleRows = 16;

double tolerance(DType t) { return t == DType::kFloat32 ? kTolF32 : kTolHalf; }

const char* short_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
  }
  return "?";
}

// --- Host storage in the three dtypes ------------------------------------------------------------

float round_to(DType t, float x) {
  switch (t) {
    case DType::kFloat32: return x;
    case DType::kFloat16: return fa::f16_to_f32(fa::f32_to_f16(x));
    case DType::kBFloat16: return fa::bf16_to_f32(fa::f32_to_bf16(x));
  }
  return x;
}

void put(std::vector<uint8_t>& raw, DType t, int64_t index, float x) {
  if (t == DType::kFloat32) {
    std::memcpy(raw.data() + 4 * index, &x, 4);
  } else {
    const uint16_t h = t == DType::kFloat16 ? fa::f32_to_f16(x) : fa::f32_to_bf16(x);
    std::memcpy(raw.data() + 2 * index, &h, 2);
  }
}

float get(const std::vector<uint8_t>& raw, DType t, int64_t index) {
  if (t == DType::kFloat32) {
    float x;
    std::memcpy(&x, raw.data() + 4 * index, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, raw.data() + 2 * index, 2);
  return t == DType::kFloat16 ? fa::f16_to_f32(h) : fa::bf16_to_f32(h);
}

// Element strides of a [batch, seq, heads, dim] tensor. Padding after each head / row / batch makes a
// kernel that assumes contiguity read or write the wrong elements.
struct Layout {
  int64_t batch = 0, seq = 0, heads = 0, dim = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
  int64_t elems = 0;  // allocated elements, padding included
  int64_t at(int64_t b, int64_t s, int64_t h) const { return b * batch_stride + s * row_stride + h * head_stride; }
  int64_t logical_elems() const { return batch * seq * heads * dim; }
};

struct Padding {
  int64_t head = 0, row = 0, batch = 0;
};

Layout make_layout(int64_t batch, int64_t seq, int64_t heads, int64_t dim, Padding pad) {
  Layout l;
  l.batch = batch;
  l.seq = seq;
  l.heads = heads;
  l.dim = dim;
  l.head_stride = dim + pad.head;
  l.row_stride = heads * l.head_stride + pad.row;
  l.batch_stride = seq * l.row_stride + pad.batch;
  l.elems = batch * l.batch_stride;
  return l;
}

// Applies f(logical index, storage index) to every element, logical order [batch, seq, heads, dim].
template <typename F>
void for_each_element(const Layout& l, F&& f) {
  int64_t logical = 0;
  for (int64_t b = 0; b < l.batch; ++b)
    for (int64_t s = 0; s < l.seq; ++s)
      for (int64_t h = 0; h < l.heads; ++h)
        for (int64_t d = 0; d < l.dim; ++d) f(logical++, l.at(b, s, h) + d);
}

// A host tensor: the bytes as the device stores them, and the logical values as float.
struct HostTensor {
  Layout layout;
  DType dtype = DType::kFloat32;
  std::vector<uint8_t> raw;
  std::vector<float> values;  // logical [batch, seq, heads, dim]
};

HostTensor random_tensor(const Layout& l, DType t, double max_mag, std::mt19937_64& rng) {
  HostTensor x;
  x.layout = l;
  x.dtype = t;
  x.raw.resize(static_cast<size_t>(l.elems) * fa::dtype_size(t));
  for (int64_t e = 0; e < l.elems; ++e) put(x.raw, t, e, kInputPadValue);
  x.values.resize(static_cast<size_t>(l.logical_elems()));
  std::uniform_real_distribution<double> mag(kMinMag, max_mag);
  std::bernoulli_distribution negative(0.5);
  for_each_element(l, [&](int64_t logical, int64_t storage) {
    const float v = round_to(t, static_cast<float>(negative(rng) ? -mag(rng) : mag(rng)));
    x.values[logical] = v;
    put(x.raw, t, storage, v);
  });
  return x;
}

std::vector<float> logical_values(const Layout& l, DType t, const std::vector<uint8_t>& raw) {
  std::vector<float> v(static_cast<size_t>(l.logical_elems()));
  for_each_element(l, [&](int64_t logical, int64_t storage) { v[logical] = get(raw, t, storage); });
  return v;
}

// Elements of the allocation outside the logical tensor (padding) that are not NaN any more.
int64_t touched_padding(const Layout& l, DType t, const std::vector<uint8_t>& raw) {
  std::vector<bool> logical(static_cast<size_t>(l.elems), false);
  for_each_element(l, [&](int64_t, int64_t storage) { logical[storage] = true; });
  int64_t touched = 0;
  for (int64_t e = 0; e < l.elems; ++e) touched += !logical[e] && !std::isnan(get(raw, t, e));
  return touched;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { CHECK_CUDA(cudaMalloc(&ptr, n)); }
  ~DeviceBuffer() { CHECK_CUDA(cudaFree(ptr)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

std::vector<uint8_t> download(const DeviceBuffer& d, cudaStream_t stream) {
  std::vector<uint8_t> h(d.bytes);
  CHECK_CUDA(cudaMemcpyAsync(h.data(), d.ptr, d.bytes, cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return h;
}

// --- float64 reference -------------------------------------------------------------------------

struct Dims {
  int64_t batch, sq, sk, hq, hkv, d;
  bool causal;
  double scale;
  int64_t group() const { return hq / hkv; }
  // Keys 0 .. visible(i) - 1 are seen by query row i (bottom-right aligned causal mask).
  int64_t visible(int64_t i) const { return causal ? std::clamp<int64_t>(i + sk - sq + 1, 0, sk) : sk; }
  int64_t q_at(int64_t b, int64_t i, int64_t h) const { return ((b * sq + i) * hq + h) * d; }
  int64_t kv_at(int64_t b, int64_t j, int64_t h) const { return ((b * sk + j) * hkv + h) * d; }
  int64_t row(int64_t b, int64_t h, int64_t i) const { return (b * hq + h) * sq + i; }
};

double dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t x = 0; x < n; ++x) s += static_cast<double>(a[x]) * b[x];
  return s;
}

// Logical (contiguous) float arrays: q, out, dout [B, Sq, Hq, D]; k, v [B, Sk, Hkv, D]; lse [B, Hq, Sq].
struct RefData {
  const float *q, *k, *v;
  const float *dout, *out_gpu, *lse_gpu;  // backward inputs (out and lse as the GPU forward produced them)
  std::vector<double> delta;              // [B, Hq, Sq]: rowsum(dout o out_gpu)
};

// Forward of query row (b, h, i): out_row[D] and its lse (+inf and zeros for an empty row).
void ref_forward_row(const Dims& g, const RefData& r, int64_t b, int64_t h, int64_t i, double* out_row, double* lse) {
  const int64_t n = g.visible(i);
  std::fill(out_row, out_row + g.d, 0.0);
  if (n == 0) {
    *lse = std::numeric_limits<double>::infinity();
    return;
  }
  const int64_t kvh = h / g.group();
  const float* qi = r.q + g.q_at(b, i, h);
  std::vector<double> s(static_cast<size_t>(n));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    s[j] = g.scale * dot(qi, r.k + g.kv_at(b, j, kvh), g.d);
    mx = std::max(mx, s[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = r.v + g.kv_at(b, j, kvh);
    for (int64_t x = 0; x < g.d; ++x) out_row[x] += s[j] / sum * vj[x];
  }
  *lse = mx + std::log(sum);
}

// P_ij and dS_ij as the backward defines them from its inputs: P = exp(scale q_i.k_j - lse_i), 0 where
// masked or lse_i = +inf; dS = P (dO_i.v_j - D_i).
void ref_p_ds(const Dims& g, const RefData& r, int64_t b, int64_t h, int64_t i, int64_t j, double* p, double* ds) {
  const int64_t row = g.row(b, h, i);
  const double lse = r.lse_gpu[row];
  if (std::isinf(lse) || j >= g.visible(i)) {
    *p = 0.0;
    *ds = 0.0;
    return;
  }
  const int64_t kvh = h / g.group();
  *p = std::exp(g.scale * dot(r.q + g.q_at(b, i, h), r.k + g.kv_at(b, j, kvh), g.d) - lse);
  *ds = *p * (dot(r.dout + g.q_at(b, i, h), r.v + g.kv_at(b, j, kvh), g.d) - r.delta[row]);
}

// dq of query row (b, h, i): scale * sum_j dS_ij k_j.
void ref_dq_row(const Dims& g, const RefData& r, int64_t b, int64_t h, int64_t i, double* dq) {
  std::fill(dq, dq + g.d, 0.0);
  const int64_t kvh = h / g.group();
  for (int64_t j = 0; j < g.sk; ++j) {
    double p, ds;
    ref_p_ds(g, r, b, h, i, j, &p, &ds);
    if (ds == 0.0) continue;
    const float* kj = r.k + g.kv_at(b, j, kvh);
    for (int64_t x = 0; x < g.d; ++x) dq[x] += g.scale * ds * kj[x];
  }
}

// dk, dv of key row (b, kvh, j), summed over the query heads of the group.
void ref_dkdv_row(const Dims& g, const RefData& r, int64_t b, int64_t kvh, int64_t j, double* dk, double* dv) {
  std::fill(dk, dk + g.d, 0.0);
  std::fill(dv, dv + g.d, 0.0);
  for (int64_t h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) {
    for (int64_t i = 0; i < g.sq; ++i) {
      double p, ds;
      ref_p_ds(g, r, b, h, i, j, &p, &ds);
      if (p == 0.0) continue;
      const float* qi = r.q + g.q_at(b, i, h);
      const float* doi = r.dout + g.q_at(b, i, h);
      for (int64_t x = 0; x < g.d; ++x) {
        dk[x] += g.scale * ds * qi[x];
        dv[x] += p * doi[x];
      }
    }
  }
}

// --- Comparison -----------------------------------------------------------------------------------

struct ErrStat {
  double max_err = 0.0, max_ref = 0.0;
  int64_t bad = 0;  // NaN in the result (unwritten element) or in the reference
  void add(double ref, double got) {
    if (std::isnan(got) || std::isnan(ref)) {
      ++bad;
      return;
    }
    max_err = std::max(max_err, std::fabs(got - ref));
    max_ref = std::max(max_ref, std::fabs(ref));
  }
  double rel(double floor) const { return max_err / std::max(max_ref, floor); }
};

struct Outcome {
  std::vector<std::string> failures;
  std::string detail;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  }
};

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

void check_err(Outcome& o, const char* name, const ErrStat& e, double tol, double floor) {
  const double rel = e.rel(floor);
  o.detail += std::string(" ") + name + "=" + fmt("%.2e", rel);
  o.expect(e.bad == 0, std::string(name) + ": " + std::to_string(e.bad) + " NaN/unwritten elements");
  o.expect(rel <= tol, std::string(name) + " error " + fmt("%.3e", rel) + " > tol " + fmt("%.0e", tol));
}

// --- One case ------------------------------------------------------------------------------------

struct Case {
  const char* note;
  int64_t batch, sq, sk, hq, hkv, d;
  bool causal;
  bool strided;        // padded, distinct strides for q, k, v and out
  double scale = 0.0;  // 0: 1 / sqrt(d)
};

struct RunOptions {
  bool sampled = false;  // check corner + random rows only (large cases)
  int time_iters = 0;    // > 0: also time forward and backward over this many calls
};

struct Rows {
  std::vector<int64_t> b, h, i;
  void add(int64_t bb, int64_t hh, int64_t ii) {
    b.push_back(bb);
    h.push_back(hh);
    i.push_back(ii);
  }
};

// All (b, h, i) with h < heads, i < seq, or (sampled) the corners and kRandomSampleRows random ones.
Rows rows_to_check(int64_t batch, int64_t heads, int64_t seq, bool sampled, std::mt19937_64& rng) {
  Rows r;
  if (!sampled) {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < seq; ++i) r.add(b, h, i);
    return r;
  }
  r.add(0, 0, 0);
  r.add(batch - 1, heads - 1, seq - 1);  // the largest offsets
  r.add(batch - 1, heads - 1, std::max<int64_t>(seq - 2, 0));
  r.add(batch - 1, heads - 1, 0);
  r.add(0, 0, seq - 1);
  for (int s = 0; s < kRandomSampleRows; ++s)
    r.add(static_cast<int64_t>(rng() % batch), static_cast<int64_t>(rng() % heads), static_cast<int64_t>(rng() % seq));
  return r;
}

struct PoolStats {
  uint64_t high = 0, current = 0;
};

cudaMemPool_t current_pool() {
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetMemPool(&pool, dev));
  return pool;
}

void reset_pool_high(cudaMemPool_t pool) {
  uint64_t zero = 0;  // the only value the attribute accepts
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

PoolStats read_pool(cudaMemPool_t pool) {
  PoolStats s;
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &s.high));
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &s.current));
  return s;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

bool run_case(const Case& c, DType t, const RunOptions& opt, std::mt19937_64& rng, cudaStream_t stream) {
  const size_t es = fa::dtype_size(t);
  const Dims g{c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.causal, c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.d))};
  const auto pad = [&](int64_t head, int64_t row, int64_t batch) {
    return c.strided ? Padding{head, row, batch} : Padding{};
  };
  const Layout lq = make_layout(c.batch, c.sq, c.hq, c.d, pad(8, 24, 40));
  const Layout lk = make_layout(c.batch, c.sk, c.hkv, c.d, pad(16, 8, 72));
  const Layout lv = make_layout(c.batch, c.sk, c.hkv, c.d, pad(0, 16, 8));
  const Layout lo = make_layout(c.batch, c.sq, c.hq, c.d, pad(24, 0, 16));
  const int64_t rows = c.batch * c.hq * c.sq;

  const HostTensor q = random_tensor(lq, t, kQkMaxMag, rng);
  const HostTensor k = random_tensor(lk, t, kQkMaxMag, rng);
  const HostTensor v = random_tensor(lv, t, kVoMaxMag, rng);
  const HostTensor dout = random_tensor(lo, t, kVoMaxMag, rng);

  DeviceBuffer d_q(q.raw.size()), d_k(k.raw.size()), d_v(v.raw.size()), d_dout(dout.raw.size());
  DeviceBuffer d_out(lo.elems * es), d_lse(rows * sizeof(float));
  DeviceBuffer d_dq(lq.elems * es), d_dk(lk.elems * es), d_dv(lv.elems * es);
  CHECK_CUDA(cudaMemcpyAsync(d_q.ptr, q.raw.data(), q.raw.size(), cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaMemcpyAsync(d_k.ptr, k.raw.data(), k.raw.size(), cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaMemcpyAsync(d_v.ptr, v.raw.data(), v.raw.size(), cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaMemcpyAsync(d_dout.ptr, dout.raw.data(), dout.raw.size(), cudaMemcpyHostToDevice, stream));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK_CUDA(fa::cuda::fill(d_out.ptr, t, lo.elems, nan, stream));
  CHECK_CUDA(fa::cuda::fill(d_lse.ptr, DType::kFloat32, rows, nan, stream));
  const auto poison_grads = [&] {
    CHECK_CUDA(fa::cuda::fill(d_dq.ptr, t, lq.elems, nan, stream));
    CHECK_CUDA(fa::cuda::fill(d_dk.ptr, t, lk.elems, nan, stream));
    CHECK_CUDA(fa::cuda::fill(d_dv.ptr, t, lv.elems, nan, stream));
  };
  poison_grads();

  fa::AttentionBwdParams p;
  p.batch = c.batch;
  p.seqlen_q = c.sq;
  p.seqlen_k = c.sk;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.q_batch_stride = lq.batch_stride, p.q_row_stride = lq.row_stride, p.q_head_stride = lq.head_stride;
  p.k_batch_stride = lk.batch_stride, p.k_row_stride = lk.row_stride, p.k_head_stride = lk.head_stride;
  p.v_batch_stride = lv.batch_stride, p.v_row_stride = lv.row_stride, p.v_head_stride = lv.head_stride;
  p.o_batch_stride = lo.batch_stride, p.o_row_stride = lo.row_stride, p.o_head_stride = lo.head_stride;
  p.dtype = t;
  p.softmax_scale = static_cast<float>(g.scale);
  p.scale_log2 = p.softmax_scale * fa::kLog2e;
  p.causal = c.causal;
  p.q = d_q.ptr;
  p.k = d_k.ptr;
  p.v = d_v.ptr;
  p.out = d_out.ptr;
  p.lse = static_cast<float*>(d_lse.ptr);
  p.dout = d_dout.ptr;
  p.lse_in = static_cast<const float*>(d_lse.ptr);
  p.dq = d_dq.ptr;
  p.dk = d_dk.ptr;
  p.dv = d_dv.ptr;
  p.deterministic = true;
  fa::set_grad_strides_like_inputs(&p);

  Outcome o;
  const cudaMemPool_t pool = current_pool();
  const size_t fwd_ws = fa::cuda::naive_attention_fwd_workspace_bytes(p);
  const size_t bwd_ws = fa::cuda::naive_attention_bwd_workspace_bytes(p);
  // Runs one call with the pool's high watermark reset first; checks the workspace went back to the pool.
  const auto run_measured = [&](bool backward, size_t ws_bytes) {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    reset_pool_high(pool);
    CHECK_CUDA(backward ? fa::cuda::naive_attention_bwd(p, stream) : fa::cuda::naive_attention_fwd(p, stream));
    CHECK_CUDA(cudaGetLastError());  // nothing may be left pending
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const PoolStats s = read_pool(pool);
    const char* name = backward ? "bwd" : "fwd";
    o.expect(s.high >= ws_bytes, std::string(name) + " pool high watermark " + std::to_string(s.high) +
                                     " < advertised workspace " + std::to_string(ws_bytes));
    o.expect(s.current == 0, std::string(name) + " left " + std::to_string(s.current) + " bytes in use in the pool");
    return s;
  };

  const PoolStats fwd_pool = run_measured(false, fwd_ws);
  const std::vector<uint8_t> out_raw = download(d_out, stream);
  const std::vector<uint8_t> lse_raw = download(d_lse, stream);
  const PoolStats bwd_pool = run_measured(true, bwd_ws);
  const std::vector<uint8_t> dq_raw = download(d_dq, stream);
  const std::vector<uint8_t> dk_raw = download(d_dk, stream);
  const std::vector<uint8_t> dv_raw = download(d_dv, stream);
  poison_grads();
  CHECK_CUDA(fa::cuda::naive_attention_bwd(p, stream));
  o.expect(download(d_dq, stream) == dq_raw && download(d_dk, stream) == dk_raw && download(d_dv, stream) == dv_raw,
           "backward not bit-identical across two runs");

  // Every output written, nothing written outside the logical tensors.
  const std::vector<float> out = logical_values(lo, t, out_raw);
  std::vector<float> lse(static_cast<size_t>(rows));
  std::memcpy(lse.data(), lse_raw.data(), lse_raw.size());
  const std::vector<float> dq = logical_values(lq, t, dq_raw);
  const std::vector<float> dk = logical_values(lk, t, dk_raw);
  const std::vector<float> dv = logical_values(lv, t, dv_raw);
  const auto count_nan = [](const std::vector<float>& x) {
    return static_cast<int64_t>(std::count_if(x.begin(), x.end(), [](float e) { return std::isnan(e); }));
  };
  const int64_t unwritten = count_nan(out) + count_nan(lse) + count_nan(dq) + count_nan(dk) + count_nan(dv);
  o.expect(unwritten == 0, std::to_string(unwritten) + " output elements left NaN (unwritten or NaN result)");
  const int64_t outside = touched_padding(lo, t, out_raw) + touched_padding(lq, t, dq_raw) +
                          touched_padding(lk, t, dk_raw) + touched_padding(lv, t, dv_raw);
  o.expect(outside == 0, std::to_string(outside) + " padding elements of strided outputs overwritten");

  // Empty causal rows (Sq > Sk: rows i < Sq - Sk see no key): out 0, lse +inf, dq 0, exactly.
  int64_t empty_rows = 0, empty_bad = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        if (g.visible(i) != 0) continue;
        ++empty_rows;
        bool ok = lse[g.row(b, h, i)] == std::numeric_limits<float>::infinity();
        for (int64_t x = 0; x < c.d; ++x) ok = ok && out[g.q_at(b, i, h) + x] == 0.0f && dq[g.q_at(b, i, h) + x] == 0.0f;
        empty_bad += !ok;
      }
  o.expect(empty_bad == 0, std::to_string(empty_bad) + " of " + std::to_string(empty_rows) +
                               " empty rows without out 0, lse +inf, dq 0");

  // Reference, on all rows or on sampled ones.
  RefData r{q.values.data(), k.values.data(), v.values.data(), dout.values.data(), out.data(), lse.data(), {}};
  r.delta.resize(static_cast<size_t>(rows));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) r.delta[g.row(b, h, i)] = dot(r.dout + g.q_at(b, i, h), r.out_gpu + g.q_at(b, i, h), c.d);

  ErrStat e_out, e_lse, e_dq, e_dk, e_dv;
  int64_t lse_inf_mismatch = 0;
  std::vector<double> ref_a(static_cast<size_t>(c.d)), ref_b(static_cast<size_t>(c.d));
  const Rows qrows = rows_to_check(c.batch, c.hq, c.sq, opt.sampled, rng);
  for (size_t n = 0; n < qrows.b.size(); ++n) {
    const int64_t b = qrows.b[n], h = qrows.h[n], i = qrows.i[n];
    double ref_lse;
    ref_forward_row(g, r, b, h, i, ref_a.data(), &ref_lse);
    for (int64_t x = 0; x < c.d; ++x) e_out.add(ref_a[x], out[g.q_at(b, i, h) + x]);
    const double got_lse = lse[g.row(b, h, i)];
    if (std::isinf(ref_lse) || std::isinf(got_lse)) {
      lse_inf_mismatch += !(std::isinf(ref_lse) && got_lse == std::numeric_limits<float>::infinity());
    } else {
      e_lse.add(ref_lse, got_lse);
    }
    ref_dq_row(g, r, b, h, i, ref_a.data());
    for (int64_t x = 0; x < c.d; ++x) e_dq.add(ref_a[x], dq[g.q_at(b, i, h) + x]);
  }
  const Rows krows = rows_to_check(c.batch, c.hkv, c.sk, opt.sampled, rng);
  for (size_t n = 0; n < krows.b.size(); ++n) {
    const int64_t b = krows.b[n], kvh = krows.h[n], j = krows.i[n];
    ref_dkdv_row(g, r, b, kvh, j, ref_a.data(), ref_b.data());
    for (int64_t x = 0; x < c.d; ++x) {
      e_dk.add(ref_a[x], dk[g.kv_at(b, j, kvh) + x]);
      e_dv.add(ref_b[x], dv[g.kv_at(b, j, kvh) + x]);
    }
  }
  const double tol = tolerance(t);
  check_err(o, "out", e_out, tol, kRefFloor);
  check_err(o, "lse", e_lse, kLseTol, 1.0);
  o.expect(lse_inf_mismatch == 0, std::to_string(lse_inf_mismatch) + " rows where exactly one of lse, reference is inf");
  check_err(o, "dq", e_dq, tol, kRefFloor);
  check_err(o, "dk", e_dk, tol, kRefFloor);
  check_err(o, "dv", e_dv, tol, kRefFloor);
  o.detail += " tol=" + fmt("%.0e", tol) + " ws fwd/bwd=" + fmt("%.1f", mib(fwd_ws)) + "/" + fmt("%.1f", mib(bwd_ws)) +
              " MiB (pool high " + fmt("%.1f", mib(fwd_pool.high)) + "/" + fmt("%.1f", mib(bwd_pool.high)) + ")";
  if (opt.sampled) o.detail += " [sampled rows]";

  char head[256];
  std::snprintf(head, sizeof head, "%-4s B=%" PRId64 " Sq=%" PRId64 " Sk=%" PRId64 " Hq=%" PRId64 " Hkv=%" PRId64
                " D=%" PRId64 "%s%s (%s)",
                short_name(t), c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.causal ? " causal" : "",
                c.strided ? " strided" : "", c.note);
  const bool pass = o.failures.empty();
  std::printf("%s %s |%s\n", pass ? "PASS" : "FAIL", head, o.detail.c_str());
  for (const std::string& f : o.failures) std::printf("     - %s\n", f.c_str());

  if (opt.time_iters > 0) {
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    // FLOPs as FlashAttention counts them: forward 4 B H Sq Sk D (halved when causal), backward 2.5x.
    const double fwd_flops = 4.0 * c.batch * c.hq * c.sq * c.sk * c.d * (c.causal ? 0.5 : 1.0);
    for (const bool backward : {false, true}) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      for (int it = 0; it < opt.time_iters; ++it)
        CHECK_CUDA(backward ? fa::cuda::naive_attention_bwd(p, stream) : fa::cuda::naive_attention_fwd(p, stream));
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0.0f;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      ms /= static_cast<float>(opt.time_iters);
      const double flops = fwd_flops * (backward ? 2.5 : 1.0);
      std::printf("TIME %s %s: %.3f ms/call (mean of %d), %.2f TFLOP/s, workspace %.1f MiB, pool high %.1f MiB\n",
                  backward ? "bwd" : "fwd", head, ms, opt.time_iters, flops / (ms * 1e-3) / 1e12,
                  mib(backward ? bwd_ws : fwd_ws), mib(backward ? bwd_pool.high : fwd_pool.high));
    }
    CHECK_CUDA(cudaEventDestroy(start));
    CHECK_CUDA(cudaEventDestroy(stop));
  }
  return pass;
}

// --- Standalone checks -----------------------------------------------------------------------------

bool check_fill(cudaStream_t stream) {
  constexpr size_t kCount = 1000;
  constexpr float kValue = 1.25f;  // exact in every dtype
  bool ok = true;
  for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    DeviceBuffer buf(kCount * fa::dtype_size(t));
    CHECK_CUDA(fa::cuda::fill(buf.ptr, t, kCount, kValue, stream));
    CHECK_CUDA(fa::cuda::fill(buf.ptr, t, 0, 0.0f, stream));  // count 0: no-op
    const std::vector<uint8_t> raw = download(buf, stream);
    for (size_t e = 0; e < kCount; ++e) ok = ok && get(raw, t, static_cast<int64_t>(e)) == kValue;
  }
  std::printf("%s fill (1000 elements of 1.25, each dtype; count 0 is a no-op)\n", ok ? "PASS" : "FAIL");
  return ok;
}

// A workspace far beyond any GPU: the call must return the allocation error (not abort), leave nothing
// pending in cudaGetLastError(), and leave the device usable (the following cases run). The data
// pointers are never touched because the allocation fails first.
bool check_oom(cudaStream_t stream) {
  fa::AttentionFwdParams p;
  p.batch = 1024;
  p.seqlen_q = p.seqlen_k = 1 << 20;
  p.heads_q = p.heads_kv = 1;
  p.head_dim = 64;
  fa::set_contiguous_strides(p.seqlen_q, p.heads_q, p.head_dim, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  fa::set_contiguous_strides(p.seqlen_k, p.heads_kv, p.head_dim, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  fa::set_contiguous_strides(p.seqlen_k, p.heads_kv, p.head_dim, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  fa::set_contiguous_strides(p.seqlen_q, p.heads_q, p.head_dim, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
  const size_t ws = fa::cuda::naive_attention_fwd_workspace_bytes(p);
  const cudaError_t err = fa::cuda::naive_attention_fwd(p, stream);
  const cudaError_t pending = cudaGetLastError();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const bool ok = err != cudaSuccess && pending == cudaSuccess;
  std::printf("%s oom: workspace %.3g TiB -> %s returned, %s pending afterwards\n", ok ? "PASS" : "FAIL",
              static_cast<double>(ws) / 1099511627776.0, cudaGetErrorName(err), cudaGetErrorName(pending));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = std::random_device{}();
  bool quick = false;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--quick") == 0) {
      quick = true;
    } else {
      seed = std::strtoull(argv[a], nullptr, 10);
    }
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("device %d: %s (sm_%d%d), seed %" PRIu64 " (rerun with: cuda_check %" PRIu64 ")\n", dev, prop.name,
              prop.major, prop.minor, seed, seed);
  std::mt19937_64 rng(seed);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));

  int failed = 0, passed = 0;
  const auto tally = [&](bool ok) { ok ? ++passed : ++failed; };
  tally(check_fill(stream));
  tally(check_oom(stream));

  // note, B, Sq, Sk, Hq, Hkv, D, causal, strided[, scale]
  const Case cases[] = {
      {"seqlen 1", 2, 1, 1, 2, 2, 64, false, false},
      {"seqlen 1 causal, GQA 4:1", 1, 1, 1, 4, 1, 8, true, true},
      {"seqlen 17", 2, 17, 17, 3, 3, 40, true, false},
      {"seqlen 97, GQA 4:1", 1, 97, 97, 8, 2, 128, false, true},
      {"seqlen 97, hdim 256", 1, 97, 97, 2, 2, 256, true, false},
      {"seqlen 1023", 1, 1023, 1023, 2, 2, 64, false, false},
      {"seqlen 1025, GQA 2:1", 1, 1025, 1025, 2, 1, 64, true, false},
      {"Sq < Sk, GQA 4:1", 2, 113, 203, 4, 1, 8, false, false},
      {"Sq > Sk", 1, 203, 113, 2, 2, 256, false, true},
      {"Sq > Sk causal: empty rows, GQA 4:1", 2, 203, 113, 4, 1, 40, true, false},
      {"Sq < Sk causal", 1, 113, 203, 2, 2, 128, true, true},
      {"Sq 1 causal", 2, 1, 239, 2, 2, 64, true, false},
      {"Sq 3 causal, GQA 4:1", 1, 3, 799, 4, 1, 256, true, false},
      {"Sq >> Sk causal: most rows empty", 1, 799, 3, 2, 2, 64, true, true},
      {"large logits (scale 1): needs the max subtraction", 1, 97, 131, 2, 2, 128, true, false, 1.0},
  };
  for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (const Case& c : cases) tally(run_case(c, t, RunOptions{}, rng, stream));

  if (!quick) {
    // 2 * 4 * 16411^2 = 2.15e9 > 2^31 elements of S (8.6 GB forward, 17.3 GB backward workspace).
    const Case wide{"S > 2^31 elements: 64-bit indexing", 2, 16411, 16411, 4, 2, 64, true, false};
    tally(run_case(wide, DType::kBFloat16, RunOptions{true, 0}, rng, stream));
    // The benchmark's fp32-memory-wall configuration: the memory-wall baseline.
    const Case bench{"benchmark shape", 4, 8192, 8192, 1, 1, 64, false, false};
    tally(run_case(bench, DType::kFloat32, RunOptions{true, 10}, rng, stream));
  }

  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("%s: %d passed, %d failed (seed %" PRIu64 ")\n", failed ? "FAIL" : "PASS", passed, failed, seed);
  return failed ? 1 : 0;
}
