// GPU check and timing of the training ops' CUDA kernels (csrc/cuda/ops/*.cu against
// csrc/common/op_params.h), built and run by scripts/ops-check.sh:
//     ops_check [seed] [--no-bench] [--bench-only]
// Every case: fresh random inputs (never zero; rounded to the dtype; the seed is printed), outputs
// poisoned with NaN (0xFF bytes) and workspaces with 0xFF, accumulated float32 outputs (dtable,
// dweight, dbias, columnSum's out, AdamW's state) filled with random values first so that += is
// checked, then the kernel, then a comparison with a float64 host reference written here from
// op_params.h. Tolerance, per output (the flash-attention rule):
//     max |gpu - ref64| <= kFactor * max |same - ref64| + kAtolRel * max(1, max |ref64|)
// where `same` is the same host code run in float32 with its outputs rounded to the dtype, kFactor is
// 2 (3 for gradients) and kAtolRel 1e-6 (a few float32 ulps: float math in another order, rsqrtf's
// 2 ulps). Where the reference is NaN (an id outside the table, a target outside the vocabulary) the
// output must be NaN; anywhere else it must be finite (a poisoned element left unwritten fails).
// Sizes: rows 1, 7, 97, 1025, 16384 and columns 1, 3, 65, 129, 384, 1536, 4099 (products up to
// kMaxCaseElems), vocabularies 65 and 50257, float32 / float16 / bfloat16; "mis" cases shift every
// pointer by one element (the kernels' scalar paths; the aligned cases with a row length that is a
// multiple of 16 bytes take the vector paths). Also checked: in place (add with out == a), RoPE leaves
// everything outside its strided view bit-identical, and the deterministic kernels (embedding
// backward, norm parameter gradients, norm_of) give the same bits twice.
// Output: one line per case, "ok" or "FAIL", each output's max error and bound; then the summary line
// "ops_check: N cases, F failed"; exit status 1 on any failure. Then (unless --no-bench) the GPT's
// shapes (rows 16384 = batch 64 x 256 tokens, C 384, 4C 1536, vocab 65, bf16): median time of 20 calls
// and the effective bandwidth (the bytes each kernel must move at least, over its time) against the
// device's peak (memory clock x bus width).
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "common/half.h"
#include "common/op_params.h"
#include "cuda/ops/ops_cuda.h"
#include "check_args.h"
#include "check_cuda.h"
#include "check_timing.h"

namespace {

using fa::DType;
using fa::Reduction;
namespace ops = fa::cuda;
using Rng = std::mt19937_64;

constexpr double kFactor = 2.0;
constexpr double kGradFactor = 3.0;
constexpr double kAtolRel = 1e-6;
constexpr int64_t kMaxCaseElems = int64_t{7} << 20;  // rows x cols of one case at most (16384 x 384 fits)
constexpr int32_t kIgnoreIndex = -100;
constexpr float kEps = 1e-5f;
constexpr DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr int64_t kRows[] = {1, 7, 97, 1025, 16384};
constexpr int64_t kCols[] = {1, 3, 65, 129, 384, 1536, 4099};

cudaStream_t g_stream = nullptr;
int g_cases = 0, g_failed = 0;

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

const char* short_name(DType t) {
  return t == DType::kFloat32 ? "f32" : t == DType::kFloat16 ? "f16" : t == DType::kBFloat16 ? "bf16" : "i32";
}

float round_to(DType t, float x) {
  if (t == DType::kFloat16) return fa::f16_to_f32(fa::f32_to_f16(x));
  if (t == DType::kBFloat16) return fa::bf16_to_f32(fa::f32_to_bf16(x));
  return x;
}

// ---- device buffers ---------------------------------------------------------------------------------
// n elements of t; `mis` shifts the pointer by one element (aligned to the element only).
struct Buf {
  DType t;
  int64_t n;
  char* base = nullptr;
  void* ptr = nullptr;
  Buf(DType type, int64_t count, bool mis = false) : t(type), n(count) {
    const size_t es = fa::dtype_size(t);
    CHECK_CUDA(cudaMalloc(&base, (static_cast<size_t>(n) + 1) * es + 256));
    ptr = base + (mis ? es : 0);
  }
  ~Buf() { cudaFree(base); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  size_t bytes() const { return static_cast<size_t>(n) * fa::dtype_size(t); }
  float* f() const { return static_cast<float*>(ptr); }
  void poison() const { CHECK_CUDA(cudaMemset(ptr, 0xFF, bytes())); }
  void put(const std::vector<float>& v) const {
    if (t == DType::kFloat32) {
      CHECK_CUDA(cudaMemcpy(ptr, v.data(), bytes(), cudaMemcpyHostToDevice));
      return;
    }
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = t == DType::kFloat16 ? fa::f32_to_f16(v[i]) : fa::f32_to_bf16(v[i]);
    CHECK_CUDA(cudaMemcpy(ptr, h.data(), bytes(), cudaMemcpyHostToDevice));
  }
  void put_ids(const std::vector<int32_t>& v) const {
    CHECK_CUDA(cudaMemcpy(ptr, v.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<float> get() const {
    std::vector<float> v(static_cast<size_t>(n));
    if (t == DType::kFloat32) {
      CHECK_CUDA(cudaMemcpy(v.data(), ptr, bytes(), cudaMemcpyDeviceToHost));
      return v;
    }
    std::vector<uint16_t> h(v.size());
    CHECK_CUDA(cudaMemcpy(h.data(), ptr, bytes(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < v.size(); ++i) v[i] = t == DType::kFloat16 ? fa::f16_to_f32(h[i]) : fa::bf16_to_f32(h[i]);
    return v;
  }
};

// A workspace of `bytes` (may be 0: null), poisoned.
struct Workspace {
  void* ptr = nullptr;
  explicit Workspace(size_t bytes) {
    if (bytes == 0) return;
    CHECK_CUDA(cudaMalloc(&ptr, bytes));
    CHECK_CUDA(cudaMemset(ptr, 0xFF, bytes));
  }
  ~Workspace() { cudaFree(ptr); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

void sync() { CHECK_CUDA(cudaStreamSynchronize(g_stream)); }

// Random values with magnitude in [lo, hi] and a random sign (never 0), rounded to t.
std::vector<float> rand_vec(int64_t n, DType t, double lo, double hi, Rng& rng, bool positive = false) {
  std::uniform_real_distribution<double> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const double m = mag(rng);
    x = round_to(t, static_cast<float>(!positive && neg(rng) ? -m : m));
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- one case's verdict -------------------------------------------------------------------------------
struct Case {
  std::string label;
  std::string text;
  bool ok = true;
  explicit Case(std::string l) : label(std::move(l)) {}

  // got vs ref (float64) with same (float32, rounded like got) as the yardstick; see the file comment.
  void compare(const char* name, const std::vector<float>& got, const std::vector<double>& ref,
               const std::vector<float>& same, double factor) {
    double err = 0, err_same = 0, ref_max = 0;
    int64_t wrong = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (std::isnan(ref[i])) {
        wrong += !std::isnan(got[i]);
        continue;
      }
      if (!std::isfinite(got[i])) {
        ++wrong;
        continue;
      }
      err = std::max(err, std::fabs(got[i] - ref[i]));
      err_same = std::max(err_same, std::fabs(static_cast<double>(same[i]) - ref[i]));
      ref_max = std::max(ref_max, std::fabs(ref[i]));
    }
    const double bound = factor * err_same + kAtolRel * std::max(1.0, ref_max);
    const bool pass = wrong == 0 && err <= bound;
    ok = ok && pass;
    text += fmt("%s%s %.2e<=%.2e", text.empty() ? "" : ", ", name, err, bound);
    if (wrong > 0) text += fmt(" (%" PRId64 " wrong NaN/finite)", wrong);
  }
  void require(bool cond, const char* what) {
    if (cond) return;
    ok = false;
    text += fmt("%s[%s]", text.empty() ? "" : " ", what);
  }
  ~Case() {
    ++g_cases;
    g_failed += !ok;
    std::printf("%-4s %s: %s\n", ok ? "ok" : "FAIL", label.c_str(), text.c_str());
  }
};

std::string shape_label(const char* op, DType t, int64_t rows, int64_t cols, bool mis) {
  return fmt("%-14s %-4s rows %-5" PRId64 " cols %-5" PRId64 "%s", op, short_name(t), rows, cols, mis ? " mis" : "");
}

// Accumulated in A (double: the reference; float: the same-precision yardstick), rounded to the dtype
// on store when A is float.
template <typename A>
A store(DType t, A v) {
  if constexpr (std::is_same_v<A, float>) return round_to(t, v);
  return v;
}
template <typename A>
std::vector<A> as(const std::vector<float>& v) {
  return std::vector<A>(v.begin(), v.end());
}

// ---- embedding --------------------------------------------------------------------------------------
std::vector<int32_t> random_ids(int64_t rows, int64_t vocab, Rng& rng) {
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (auto& i : ids) i = static_cast<int32_t>(pick(rng));
  if (rows >= 7) {  // ids outside the table: NaN rows forward, nothing added backward
    ids[3] = -1;
    ids[rows - 2] = static_cast<int32_t>(vocab);
  }
  return ids;
}

void check_embedding(DType t, int64_t rows, int64_t dim, int64_t vocab, bool mis, Rng& rng) {
  const auto table = rand_vec(vocab * dim, t, 0.1, 1.5, rng);
  const auto ids = random_ids(rows, vocab, rng);
  Buf d_ids(DType::kInt32, rows), d_table(t, vocab * dim, mis), d_out(t, rows * dim, mis);
  d_ids.put_ids(ids);
  d_table.put(table);
  d_out.poison();
  fa::EmbeddingParams p;
  p.rows = rows;
  p.vocab = vocab;
  p.dim = dim;
  p.dtype = t;
  p.ids = static_cast<const int32_t*>(d_ids.ptr);
  p.table = d_table.ptr;
  p.out = d_out.ptr;
  {
    Case c(shape_label("embedding_fwd", t, rows, dim, mis) + fmt(" vocab %" PRId64, vocab));
    CHECK_CUDA(ops::embedding_fwd(p, g_stream));
    sync();
    std::vector<double> ref(static_cast<size_t>(rows * dim));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dim; ++j) {
        const int32_t id = ids[r];
        ref[r * dim + j] = id >= 0 && id < vocab ? table[id * dim + j] : std::nan("");
      }
    c.compare("out", d_out.get(), ref, std::vector<float>(ref.begin(), ref.end()), kFactor);
  }
  Case c(shape_label("embedding_bwd", t, rows, dim, mis) + fmt(" vocab %" PRId64, vocab));
  const auto dout = rand_vec(rows * dim, t, 0.1, 1.5, rng);
  const auto init = rand_vec(vocab * dim, DType::kFloat32, 0.1, 1.0, rng);
  Buf d_dout(t, rows * dim, mis), d_dtable(DType::kFloat32, vocab * dim, mis);
  d_dout.put(dout);
  d_dtable.put(init);
  p.dout = d_dout.ptr;
  p.dtable = d_dtable.f();
  CHECK_CUDA(ops::embedding_bwd(p, g_stream));
  sync();
  const auto got = d_dtable.get();
  auto ref = as<double>(init);
  auto same = init;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) continue;
    for (int64_t j = 0; j < dim; ++j) {
      ref[id * dim + j] += dout[r * dim + j];
      same[id * dim + j] += dout[r * dim + j];
    }
  }
  c.compare("dtable", got, ref, same, kGradFactor);
  d_dtable.put(init);
  CHECK_CUDA(ops::embedding_bwd(p, g_stream));
  sync();
  c.require(same_bits(got, d_dtable.get()), "dtable differs between two runs");
}

// ---- RMSNorm / LayerNorm ------------------------------------------------------------------------------
enum class NormKind { kRms, kLayerBias, kLayerNoBias };
const char* norm_name(NormKind k) {
  return k == NormKind::kRms ? "rms" : k == NormKind::kLayerBias ? "layer+bias" : "layer";
}

template <typename A>
void norm_fwd_host(DType t, NormKind kind, int64_t rows, int64_t cols, const std::vector<float>& x,
                   const std::vector<float>& w, const std::vector<float>& b, std::vector<A>& out, std::vector<A>& mean,
                   std::vector<A>& rstd) {
  const bool ln = kind != NormKind::kRms;
  out.assign(static_cast<size_t>(rows * cols), 0);
  mean.assign(static_cast<size_t>(rows), 0);
  rstd.assign(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x[r * cols];
    A mu = 0;
    if (ln) {
      for (int64_t j = 0; j < cols; ++j) mu += static_cast<A>(xr[j]);
      mu /= static_cast<A>(cols);
    }
    A ss = 0;
    for (int64_t j = 0; j < cols; ++j) ss += (xr[j] - mu) * (xr[j] - mu);
    const A rs = static_cast<A>(1) / std::sqrt(ss / static_cast<A>(cols) + static_cast<A>(kEps));
    for (int64_t j = 0; j < cols; ++j) {
      A y = (xr[j] - mu) * rs * static_cast<A>(w[j]);
      if (kind == NormKind::kLayerBias) y += static_cast<A>(b[j]);
      out[r * cols + j] = store<A>(t, y);
    }
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <typename A>
void norm_bwd_host(DType t, NormKind kind, int64_t rows, int64_t cols, const std::vector<float>& x,
                   const std::vector<float>& w, const std::vector<float>& dout, const std::vector<float>& mean,
                   const std::vector<float>& rstd, std::vector<A>& dx, std::vector<A>& dw, std::vector<A>& db) {
  const bool ln = kind != NormKind::kRms;
  dx.assign(static_cast<size_t>(rows * cols), 0);
  for (int64_t r = 0; r < rows; ++r) {
    // float64: the row's own statistics (the gradient of the op, as the JS reference); float: the
    // forward's float32 ones, as a plain implementation uses them.
    A mu = ln ? static_cast<A>(mean[r]) : 0, rs = rstd[r];
    if constexpr (std::is_same_v<A, double>) {
      double m = 0, v = 0;
      if (ln) {
        for (int64_t j = 0; j < cols; ++j) m += x[r * cols + j];
        m /= static_cast<double>(cols);
      }
      for (int64_t j = 0; j < cols; ++j) v += (x[r * cols + j] - m) * (x[r * cols + j] - m);
      mu = m;
      rs = 1.0 / std::sqrt(v / static_cast<double>(cols) + static_cast<double>(static_cast<float>(kEps)));
    }
    A sg = 0, sgx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const A g = static_cast<A>(dout[r * cols + j]) * w[j];
      sg += g;
      sgx += g * ((x[r * cols + j] - mu) * rs);
    }
    const A mg = ln ? sg / static_cast<A>(cols) : 0, mgx = sgx / static_cast<A>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const A xhat = (x[r * cols + j] - mu) * rs;
      const A g = static_cast<A>(dout[r * cols + j]) * w[j];
      dx[r * cols + j] = store<A>(t, rs * (g - mg - xhat * mgx));
      dw[j] += static_cast<A>(dout[r * cols + j]) * xhat;
      if (ln) db[j] += dout[r * cols + j];
    }
  }
}

void check_norm(DType t, NormKind kind, int64_t rows, int64_t cols, bool mis, Rng& rng) {
  const bool ln = kind != NormKind::kRms;
  auto x = rand_vec(rows * cols, DType::kFloat32, 0.1, 2.0, rng);
  for (auto& v : x) v = round_to(t, v + (ln ? 0.3f : 0.0f));  // LayerNorm: a mean to remove
  const auto w = rand_vec(cols, t, 0.5, 1.5, rng);
  const auto b = rand_vec(cols, t, 0.1, 1.0, rng);
  Buf d_x(t, rows * cols, mis), d_w(t, cols, mis), d_b(t, cols, mis), d_out(t, rows * cols, mis);
  Buf d_mean(DType::kFloat32, rows, mis), d_rstd(DType::kFloat32, rows, mis);
  d_x.put(x);
  d_w.put(w);
  d_b.put(b);
  d_out.poison();
  d_mean.poison();
  d_rstd.poison();
  fa::NormParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = t;
  p.eps = kEps;
  p.layer_norm = ln;
  p.x = d_x.ptr;
  p.weight = d_w.ptr;
  p.bias = kind == NormKind::kLayerBias ? d_b.ptr : nullptr;
  p.out = d_out.ptr;
  p.mean = ln ? d_mean.f() : nullptr;
  p.rstd = d_rstd.f();
  std::vector<double> out_ref, mean_ref, rstd_ref;
  {
    Case c(shape_label("norm_fwd", t, rows, cols, mis) + " " + norm_name(kind));
    CHECK_CUDA(ops::norm_fwd(p, g_stream));
    sync();
    std::vector<float> out_same, mean_same, rstd_same;
    norm_fwd_host<double>(t, kind, rows, cols, x, w, b, out_ref, mean_ref, rstd_ref);
    norm_fwd_host<float>(t, kind, rows, cols, x, w, b, out_same, mean_same, rstd_same);
    c.compare("out", d_out.get(), out_ref, out_same, kFactor);
    c.compare("rstd", d_rstd.get(), rstd_ref, rstd_same, kFactor);
    if (ln) c.compare("mean", d_mean.get(), mean_ref, mean_same, kFactor);
  }
  // LayerNorm without a bias, odd sizes: no parameter gradients at all (dx alone).
  const bool dx_only = kind == NormKind::kLayerNoBias && rows % 2 == 1 && cols % 2 == 1;
  Case c(shape_label("norm_bwd", t, rows, cols, mis) + " " + norm_name(kind) + (dx_only ? " dx only" : ""));
  // The forward's float32 statistics, as the backward receives them.
  const std::vector<float> mean(mean_ref.begin(), mean_ref.end()), rstd(rstd_ref.begin(), rstd_ref.end());
  const auto dout = rand_vec(rows * cols, t, 0.1, 1.5, rng);
  const auto dw0 = rand_vec(cols, DType::kFloat32, 0.1, 1.0, rng);
  const auto db0 = rand_vec(cols, DType::kFloat32, 0.1, 1.0, rng);
  Buf d_dout(t, rows * cols, mis), d_dx(t, rows * cols, mis), d_dw(DType::kFloat32, cols, mis),
      d_db(DType::kFloat32, cols, mis);
  d_mean.put(mean);
  d_rstd.put(rstd);
  d_dout.put(dout);
  d_dx.poison();
  d_dw.put(dw0);
  d_db.put(db0);
  p.dout = d_dout.ptr;
  p.mean_in = ln ? d_mean.f() : nullptr;
  p.rstd_in = d_rstd.f();
  p.dx = d_dx.ptr;
  p.dweight = dx_only ? nullptr : d_dw.f();
  p.dbias = kind == NormKind::kLayerBias ? d_db.f() : nullptr;
  Workspace ws(ops::norm_bwd_workspace_bytes(p));
  p.workspace = ws.ptr;
  CHECK_CUDA(ops::norm_bwd(p, g_stream));
  sync();
  std::vector<double> dx_ref, dw_ref = as<double>(dw0), db_ref = as<double>(db0);
  std::vector<float> dx_same, dw_same = dw0, db_same = db0;
  norm_bwd_host<double>(t, kind, rows, cols, x, w, dout, mean, rstd, dx_ref, dw_ref, db_ref);
  norm_bwd_host<float>(t, kind, rows, cols, x, w, dout, mean, rstd, dx_same, dw_same, db_same);
  const auto dw_got = d_dw.get();
  c.compare("dx", d_dx.get(), dx_ref, dx_same, kGradFactor);
  if (kind == NormKind::kLayerBias) c.compare("dbias", d_db.get(), db_ref, db_same, kGradFactor);
  if (kind == NormKind::kLayerNoBias) c.require(same_bits(d_db.get(), db0), "dbias written without a bias");
  if (dx_only) {
    c.require(same_bits(dw_got, dw0), "dweight written without being asked for");
    return;
  }
  c.compare("dweight", dw_got, dw_ref, dw_same, kGradFactor);
  d_dw.put(dw0);
  CHECK_CUDA(ops::norm_bwd(p, g_stream));
  sync();
  c.require(same_bits(dw_got, d_dw.get()), "dweight differs between two runs");
}

// ---- RoPE ---------------------------------------------------------------------------------------------
// q (slot 0) or k (slot 1) of a packed [B, S, 3, H, D] tensor.
void check_rope(DType t, int64_t B, int64_t S, int64_t H, int64_t D, int slot, bool inverse, int64_t offset,
                float base, Rng& rng) {
  Case c(fmt("%-14s %-4s B %" PRId64 " S %" PRId64 " H %" PRId64 " D %" PRId64 " slot %d%s offset %" PRId64, "rope",
             short_name(t), B, S, H, D, slot, inverse ? " inverse" : "", offset));
  const int64_t n = B * S * 3 * H * D;
  const auto x = rand_vec(n, t, 0.1, 1.5, rng);
  Buf d_x(t, n);
  d_x.put(x);
  fa::RopeParams p;
  p.batch = B;
  p.seqlen = S;
  p.heads = H;
  p.head_dim = D;
  p.batch_stride = S * 3 * H * D;
  p.row_stride = 3 * H * D;
  p.head_stride = D;
  p.dtype = t;
  p.x = static_cast<char*>(d_x.ptr) + slot * H * D * fa::dtype_size(t);
  p.base = base;
  p.position_offset = offset;
  p.inverse = inverse;
  CHECK_CUDA(ops::rope(p, g_stream));
  sync();
  const auto got = d_x.get();
  std::vector<double> ref(x.begin(), x.end());
  std::vector<float> same = x;
  std::vector<char> in_view(static_cast<size_t>(n), 0);
  const int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < half; ++i) {
        const float theta = static_cast<float>(std::pow(static_cast<double>(base), -2.0 * i / static_cast<double>(D)));
        const float angle = static_cast<float>(offset + s) * theta;
        const double sd = (inverse ? -1 : 1) * std::sin(static_cast<double>(angle)), cd = std::cos(static_cast<double>(angle));
        const float sf = (inverse ? -1 : 1) * std::sin(angle), cf = std::cos(angle);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t e = b * p.batch_stride + s * p.row_stride + slot * H * D + h * D + i;
          const float x1 = x[e], x2 = x[e + half];
          ref[e] = x1 * cd - x2 * sd;
          ref[e + half] = x1 * sd + x2 * cd;
          same[e] = round_to(t, x1 * cf - x2 * sf);
          same[e + half] = round_to(t, x1 * sf + x2 * cf);
          in_view[e] = in_view[e + half] = 1;
        }
      }
  c.compare("x", got, ref, same, kFactor);
  bool untouched = true;
  for (int64_t e = 0; e < n; ++e)
    if (!in_view[e] && std::memcmp(&got[e], &x[e], sizeof(float)) != 0) untouched = false;
  c.require(untouched, "elements outside the view changed");
}

// ---- activations and add -------------------------------------------------------------------------------
template <typename A>
A gelu_host(A x) {
  const A k0 = static_cast<A>(0.7978845608028654), k1 = static_cast<A>(0.044715);
  return static_cast<A>(0.5) * x * (1 + std::tanh(k0 * (x + k1 * x * x * x)));
}
template <typename A>
A gelu_grad_host(A x) {
  const A k0 = static_cast<A>(0.7978845608028654), k1 = static_cast<A>(0.044715);
  const A th = std::tanh(k0 * (x + k1 * x * x * x));
  return static_cast<A>(0.5) * (1 + th) + static_cast<A>(0.5) * x * (1 - th * th) * k0 * (1 + 3 * k1 * x * x);
}

void check_gelu(DType t, int64_t n, bool mis, Rng& rng) {
  const auto x = rand_vec(n, t, 0.05, 4.0, rng);
  const auto dout = rand_vec(n, t, 0.1, 1.5, rng);
  Buf d_x(t, n, mis), d_dout(t, n, mis), d_out(t, n, mis);
  d_x.put(x);
  d_dout.put(dout);
  fa::GeluParams p;
  p.numel = n;
  p.dtype = t;
  p.x = d_x.ptr;
  p.dout = d_dout.ptr;
  p.out = d_out.ptr;
  std::vector<double> ref(static_cast<size_t>(n));
  std::vector<float> same(static_cast<size_t>(n));
  {
    Case c(shape_label("gelu_fwd", t, 1, n, mis));
    d_out.poison();
    CHECK_CUDA(ops::gelu_fwd(p, g_stream));
    sync();
    for (int64_t i = 0; i < n; ++i) {
      ref[i] = gelu_host<double>(x[i]);
      same[i] = round_to(t, gelu_host<float>(x[i]));
    }
    c.compare("out", d_out.get(), ref, same, kFactor);
  }
  Case c(shape_label("gelu_bwd", t, 1, n, mis));
  d_out.poison();
  CHECK_CUDA(ops::gelu_bwd(p, g_stream));
  sync();
  for (int64_t i = 0; i < n; ++i) {
    ref[i] = static_cast<double>(dout[i]) * gelu_grad_host<double>(x[i]);
    same[i] = round_to(t, dout[i] * gelu_grad_host<float>(x[i]));
  }
  c.compare("dx", d_out.get(), ref, same, kGradFactor);
}

template <typename A>
A sigmoid_host(A a) {
  return 1 / (1 + std::exp(-a));
}

void check_swiglu(DType t, int64_t rows, int64_t cols, bool mis, Rng& rng) {
  const auto x = rand_vec(rows * 2 * cols, t, 0.05, 4.0, rng);
  const auto dout = rand_vec(rows * cols, t, 0.1, 1.5, rng);
  Buf d_x(t, rows * 2 * cols, mis), d_dout(t, rows * cols, mis), d_out(t, rows * cols, mis),
      d_dx(t, rows * 2 * cols, mis);
  d_x.put(x);
  d_dout.put(dout);
  d_out.poison();
  d_dx.poison();
  fa::SwigluParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = t;
  p.x = d_x.ptr;
  p.out = d_out.ptr;
  {
    Case c(shape_label("swiglu_fwd", t, rows, cols, mis));
    CHECK_CUDA(ops::swiglu_fwd(p, g_stream));
    sync();
    std::vector<double> ref(static_cast<size_t>(rows * cols));
    std::vector<float> same(ref.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const float a = x[r * 2 * cols + j], bv = x[r * 2 * cols + cols + j];
        ref[r * cols + j] = a * sigmoid_host<double>(a) * bv;
        same[r * cols + j] = round_to(t, a * sigmoid_host<float>(a) * bv);
      }
    c.compare("out", d_out.get(), ref, same, kFactor);
  }
  Case c(shape_label("swiglu_bwd", t, rows, cols, mis));
  p.dout = d_dout.ptr;
  p.out = d_dx.ptr;
  CHECK_CUDA(ops::swiglu_bwd(p, g_stream));
  sync();
  std::vector<double> ref(static_cast<size_t>(rows * 2 * cols));
  std::vector<float> same(ref.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const float a = x[r * 2 * cols + j], bv = x[r * 2 * cols + cols + j], g = dout[r * cols + j];
      const double sd = sigmoid_host<double>(a);
      const float sf = sigmoid_host<float>(a);
      ref[r * 2 * cols + j] = g * bv * sd * (1 + a * (1 - sd));
      ref[r * 2 * cols + cols + j] = g * (a * sd);
      same[r * 2 * cols + j] = round_to(t, g * bv * sf * (1 + a * (1 - sf)));
      same[r * 2 * cols + cols + j] = round_to(t, g * (a * sf));
    }
  c.compare("dx", d_dx.get(), ref, same, kGradFactor);
}

void check_add(DType t, int64_t n, float alpha, bool in_place, bool mis, Rng& rng) {
  Case c(shape_label("add", t, 1, n, mis) + fmt(" alpha %g%s", alpha, in_place ? " in place" : ""));
  const auto a = rand_vec(n, t, 0.1, 1.5, rng);
  const auto b = rand_vec(n, t, 0.1, 1.5, rng);
  Buf d_a(t, n, mis), d_b(t, n, mis), d_out(t, n, mis);
  d_a.put(a);
  d_b.put(b);
  d_out.poison();
  fa::AddParams p;
  p.numel = n;
  p.dtype = t;
  p.alpha = alpha;
  p.a = d_a.ptr;
  p.b = d_b.ptr;
  p.out = in_place ? d_a.ptr : d_out.ptr;
  CHECK_CUDA(ops::add(p, g_stream));
  sync();
  std::vector<double> ref(static_cast<size_t>(n));
  std::vector<float> same(ref.size());
  for (int64_t i = 0; i < n; ++i) {
    ref[i] = a[i] + static_cast<double>(alpha) * b[i];
    same[i] = round_to(t, a[i] + alpha * b[i]);
  }
  c.compare("out", in_place ? d_a.get() : d_out.get(), ref, same, kFactor);
}

// ---- cross-entropy -------------------------------------------------------------------------------------
enum class Targets { kWithIgnored, kWithInvalid, kAllIgnored };
const char* targets_name(Targets m) {
  return m == Targets::kWithIgnored ? "ignored rows" : m == Targets::kWithInvalid ? "an invalid target" : "all ignored";
}
const char* reduction_name(Reduction r) {
  return r == Reduction::kNone ? "none" : r == Reduction::kSum ? "sum" : "mean";
}

template <typename A>
void ce_host(DType t, int64_t rows, int64_t vocab, const std::vector<float>& x, const std::vector<int32_t>& tg,
             Reduction red, float grad_scale, std::vector<A>& loss, std::vector<A>& dl) {
  std::vector<A> row_loss(static_cast<size_t>(rows)), lse(static_cast<size_t>(rows));
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x[r * vocab];
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < vocab; ++j) m = std::max<A>(m, xr[j]);
    A s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(xr[j] - m);
    lse[r] = m + std::log(s);
    const int32_t target = tg[r];
    if (target == kIgnoreIndex) continue;
    ++count;
    row_loss[r] = target >= 0 && target < vocab ? lse[r] - static_cast<A>(xr[target]) : std::numeric_limits<A>::quiet_NaN();
  }
  A total = 0;
  for (int64_t r = 0; r < rows; ++r) total += row_loss[r];
  if (red == Reduction::kNone) {
    loss = row_loss;
  } else {
    loss.assign(1, red == Reduction::kSum ? total : total / static_cast<A>(count));
  }
  const A w = red == Reduction::kMean ? static_cast<A>(1) / static_cast<A>(count) : 1;
  const A scale = static_cast<A>(grad_scale) * w;
  dl.assign(static_cast<size_t>(rows * vocab), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = tg[r];
    const bool valid = target >= 0 && target < vocab;
    for (int64_t j = 0; j < vocab; ++j) {
      A d = 0;
      if (target == kIgnoreIndex) {
        d = 0;
      } else if (!valid) {
        d = std::numeric_limits<A>::quiet_NaN();
      } else {
        d = scale * (std::exp(x[r * vocab + j] - lse[r]) - (j == target ? 1 : 0));
      }
      dl[r * vocab + j] = store<A>(t, d);
    }
  }
}

// A target that is neither in [0, vocab) nor ignore_index: vocab on odd row counts, -5 on even ones.
int32_t invalid_target(int64_t rows, int64_t vocab) { return rows % 2 == 1 ? static_cast<int32_t>(vocab) : -5; }

void check_cross_entropy(DType t, int64_t rows, int64_t vocab, Reduction red, bool grad, Targets mode, bool mis,
                         Rng& rng) {
  Case c(fmt("%-14s %-4s rows %-5" PRId64 " vocab %-5" PRId64 "%s %s%s, %s", "cross_entropy", short_name(t), rows,
             vocab, mis ? " mis" : "", reduction_name(red), grad ? " +grad" : "", targets_name(mode)));
  const auto x = rand_vec(rows * vocab, t, 0.1, 4.0, rng);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<int32_t> tg(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    tg[r] = mode == Targets::kAllIgnored || r % 5 == 2 ? kIgnoreIndex : static_cast<int32_t>(pick(rng));
  }
  if (mode == Targets::kWithInvalid) tg[rows / 2] = invalid_target(rows, vocab);
  constexpr float kGradScale = 0.5f;
  const int64_t nloss = red == Reduction::kNone ? rows : 1;
  Buf d_x(t, rows * vocab, mis), d_tg(DType::kInt32, rows), d_loss(DType::kFloat32, nloss, mis),
      d_dl(t, rows * vocab, mis);
  d_x.put(x);
  d_tg.put_ids(tg);
  d_loss.poison();
  d_dl.poison();
  fa::CrossEntropyParams p;
  p.rows = rows;
  p.vocab = vocab;
  p.dtype = t;
  p.logits = d_x.ptr;
  p.targets = static_cast<const int32_t*>(d_tg.ptr);
  p.ignore_index = kIgnoreIndex;
  p.reduction = red;
  p.loss = d_loss.f();
  p.dlogits = grad ? d_dl.ptr : nullptr;
  p.grad_scale = kGradScale;
  Workspace ws(ops::cross_entropy_workspace_bytes(p));
  p.workspace = ws.ptr;
  CHECK_CUDA(ops::cross_entropy(p, g_stream));
  sync();
  std::vector<double> loss_ref, dl_ref;
  std::vector<float> loss_same, dl_same;
  ce_host<double>(t, rows, vocab, x, tg, red, kGradScale, loss_ref, dl_ref);
  ce_host<float>(t, rows, vocab, x, tg, red, kGradScale, loss_same, dl_same);
  c.compare("loss", d_loss.get(), loss_ref, loss_same, kFactor);
  if (grad) c.compare("dlogits", d_dl.get(), dl_ref, dl_same, kGradFactor);
}

// ---- AdamW ---------------------------------------------------------------------------------------------
struct AdamHyper {
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
  int step = 3;
  float bc1() const { return static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step)); }
  float bc2() const { return static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step)); }
};

template <typename A>
void adamw_host(const AdamHyper& h, float clip, const std::vector<float>& grad, std::vector<A>& w, std::vector<A>& m,
                std::vector<A>& v) {
  const A lr = h.lr, wd = h.wd, b1 = h.beta1, b2 = h.beta2, eps = h.eps, bc1 = h.bc1(), bc2 = h.bc2();
  for (size_t i = 0; i < grad.size(); ++i) {
    const A g = static_cast<A>(grad[i]) * static_cast<A>(h.grad_scale) * static_cast<A>(clip);
    w[i] -= lr * wd * w[i];
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * (g * g);
    w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
  }
}

// nan_norm: the clipping norm is NaN (an overflowed gradient norm): every output must become NaN.
void check_adamw(DType t, int64_t n, bool clip, bool mis, Rng& rng, bool nan_norm = false) {
  Case c(shape_label("adamw", t, 1, n, mis) + (clip ? " clip" : "") + (nan_norm ? " NaN norm" : ""));
  const AdamHyper h;
  const bool use_master = t != DType::kFloat32;
  const auto master = rand_vec(n, DType::kFloat32, 0.05, 1.0, rng);
  std::vector<float> param(master.size());
  for (size_t i = 0; i < param.size(); ++i) param[i] = round_to(t, master[i]);
  const auto w0 = use_master ? master : param;
  const auto grad = rand_vec(n, DType::kFloat32, 0.01, 1.0, rng);
  const auto m0 = rand_vec(n, DType::kFloat32, 1e-3, 0.1, rng);
  const auto v0 = rand_vec(n, DType::kFloat32, 1e-4, 1e-2, rng, true);
  constexpr float kMaxNorm = 1.0f;
  const float norm = nan_norm ? std::numeric_limits<float>::quiet_NaN() : 2.5f;
  Buf d_param(t, n, mis), d_master(DType::kFloat32, n, mis), d_grad(DType::kFloat32, n, mis),
      d_m(DType::kFloat32, n, mis), d_v(DType::kFloat32, n, mis), d_norm(DType::kFloat32, 1);
  d_param.put(param);
  d_master.put(master);
  d_grad.put(grad);
  d_m.put(m0);
  d_v.put(v0);
  d_norm.put({norm});
  fa::AdamWParams p;
  p.numel = n;
  p.dtype = t;
  p.param = d_param.ptr;
  p.master = use_master ? d_master.f() : nullptr;
  p.grad = d_grad.f();
  p.m = d_m.f();
  p.v = d_v.f();
  p.lr = h.lr;
  p.beta1 = h.beta1;
  p.beta2 = h.beta2;
  p.eps = h.eps;
  p.weight_decay = h.wd;
  p.bias_correction1 = h.bc1();
  p.bias_correction2 = h.bc2();
  p.grad_scale = h.grad_scale;
  p.clip_norm = clip ? d_norm.f() : nullptr;
  p.max_norm = kMaxNorm;
  CHECK_CUDA(ops::adamw(p, g_stream));
  sync();
  const float ratio = kMaxNorm / (norm + 1e-6f);
  const float clip_f = clip ? (ratio > 1.0f ? 1.0f : ratio) : 1.0f;  // min(1, ratio), NaN kept
  auto w_ref = as<double>(w0), m_ref = as<double>(m0), v_ref = as<double>(v0);
  auto w_same = w0, m_same = m0, v_same = v0;
  adamw_host<double>(h, clip_f, grad, w_ref, m_ref, v_ref);
  adamw_host<float>(h, clip_f, grad, w_same, m_same, v_same);
  std::vector<float> param_same(w_same.size());
  for (size_t i = 0; i < w_same.size(); ++i) param_same[i] = round_to(t, w_same[i]);
  c.compare("param", d_param.get(), w_ref, param_same, kFactor);
  if (use_master) c.compare("master", d_master.get(), w_ref, w_same, kFactor);
  c.compare("m", d_m.get(), m_ref, m_same, kFactor);
  c.compare("v", d_v.get(), v_ref, v_same, kFactor);
}

// ---- reductions ----------------------------------------------------------------------------------------
struct SpanSpec {
  DType t;
  int64_t n;
  bool mis;
};

void check_norm_of(const std::vector<SpanSpec>& specs, const char* what, Rng& rng) {
  Case c(fmt("%-14s %zu tensors (%s)", "norm_of", specs.size(), what));
  std::vector<std::unique_ptr<Buf>> bufs;
  fa::NormOfParams p;
  double ref = 0;
  float same = 0;
  for (const SpanSpec& s : specs) {
    const auto v = rand_vec(s.n, s.t, 0.1, 1.5, rng);
    bufs.push_back(std::make_unique<Buf>(s.t, s.n, s.mis));
    bufs.back()->put(v);
    p.tensors.push_back(fa::TensorSpan{bufs.back()->ptr, s.n, s.t});
    for (float x : v) {
      ref += static_cast<double>(x) * x;
      same += x * x;
    }
  }
  Buf d_out(DType::kFloat32, 1);
  d_out.poison();
  p.out = d_out.f();
  Workspace ws(ops::norm_of_workspace_bytes(p));
  p.workspace = ws.ptr;
  CHECK_CUDA(ops::norm_of(p, g_stream));
  sync();
  const auto got = d_out.get();
  c.compare("norm", got, {std::sqrt(ref)}, {std::sqrt(same)}, kFactor);
  d_out.poison();
  CHECK_CUDA(ops::norm_of(p, g_stream));
  sync();
  c.require(same_bits(got, d_out.get()), "norm differs between two runs");
}

void check_sum(DType t, int64_t n, bool mis, Rng& rng) {
  Case c(shape_label("sum", t, 1, n, mis));
  const auto x = rand_vec(n, t, 0.1, 1.5, rng);
  Buf d_x(t, n, mis), d_out(DType::kFloat32, 1);
  d_x.put(x);
  d_out.poison();
  fa::SumParams p;
  p.numel = n;
  p.dtype = t;
  p.x = d_x.ptr;
  p.out = d_out.f();
  Workspace ws(ops::sum_workspace_bytes(p));
  p.workspace = ws.ptr;
  CHECK_CUDA(ops::sum(p, g_stream));
  sync();
  double ref = 0;
  float same = 0;
  for (float v : x) {
    ref += v;
    same += v;
  }
  c.compare("sum", d_out.get(), {ref}, {same}, kFactor);
}

void check_column_sum(DType t, int64_t rows, int64_t cols, bool accumulate, bool mis, Rng& rng) {
  Case c(shape_label("column_sum", t, rows, cols, mis) + (accumulate ? " +=" : " ="));
  const auto x = rand_vec(rows * cols, t, 0.1, 1.5, rng);
  const auto init = rand_vec(cols, DType::kFloat32, 0.1, 1.0, rng);
  Buf d_x(t, rows * cols, mis), d_out(DType::kFloat32, cols, mis);
  d_x.put(x);
  if (accumulate) {
    d_out.put(init);
  } else {
    d_out.poison();
  }
  fa::ColumnSumParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = t;
  p.x = d_x.ptr;
  p.out = d_out.f();
  p.accumulate = accumulate;
  Workspace ws(ops::column_sum_workspace_bytes(p));
  p.workspace = ws.ptr;
  CHECK_CUDA(ops::column_sum(p, g_stream));
  sync();
  std::vector<double> ref(static_cast<size_t>(cols), 0.0);
  std::vector<float> same(static_cast<size_t>(cols), 0.0f);
  if (accumulate) {
    ref = as<double>(init);
    same = init;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      ref[j] += x[r * cols + j];
      same[j] += x[r * cols + j];
    }
  c.compare("out", d_out.get(), ref, same, kGradFactor);
}

// ---- timing on the GPT's shapes ------------------------------------------------------------------------
double peak_gbps() {
  int dev = 0, clock_khz = 0, bus_bits = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
}

template <typename Launch>
void bench(const char* name, const std::string& shape, double bytes, double peak, Launch&& launch) {
  const LaunchTimes tm = time_launches(launch, g_stream);
  const double gbps = bytes / (tm.median_ms * 1e-3) / 1e9;
  const double gbps_q = bytes / (tm.queued_ms * 1e-3) / 1e9;
  std::printf("BENCH %-16s %-34s %7.1f MB  median %8.4f ms %7.1f GB/s (%4.1f%% of peak) | back to back %8.4f ms %7.1f GB/s\n",
              name, shape.c_str(), bytes / 1e6, tm.median_ms, gbps, 100.0 * gbps / peak, tm.queued_ms, gbps_q);
}

void run_bench(Rng& rng) {
  constexpr int64_t kRowsGpt = 64 * 256, kC = 384, kC4 = 4 * kC, kVocab = 65, kHeads = 6, kHeadDim = 64;
  constexpr int64_t kParams = 10'700'000;  // the default GPT's parameter count (6 layers, d_model 384)
  constexpr int kParamTensors = 75;
  const DType t = DType::kBFloat16;
  const double e = 2.0;  // bytes per bf16 element
  const double peak = peak_gbps();
  std::printf("bench: bf16, rows %" PRId64 " (batch 64 x 256 tokens), C %" PRId64 ", 4C %" PRId64 ", vocab %" PRId64
              "; peak %.0f GB/s; bytes = the least each kernel must read and write\n",
              kRowsGpt, kC, kC4, kVocab, peak);
  const int64_t nc = kRowsGpt * kC, n4 = kRowsGpt * kC4;
  Buf x(t, n4 * 2), y(t, n4 * 2), z(t, n4), ids(DType::kInt32, kRowsGpt), table(t, kVocab * kC),
      dtable(DType::kFloat32, kVocab * kC), w(t, kC), bias(t, kC), mean(DType::kFloat32, kRowsGpt),
      rstd(DType::kFloat32, kRowsGpt), dw(DType::kFloat32, kC4), db(DType::kFloat32, kC4);
  x.put(rand_vec(x.n, t, 0.1, 1.5, rng));
  y.put(rand_vec(y.n, t, 0.1, 1.5, rng));
  ids.put_ids(random_ids(kRowsGpt, kVocab, rng));
  table.put(rand_vec(table.n, t, 0.1, 1.5, rng));
  w.put(rand_vec(kC, t, 0.5, 1.5, rng));
  bias.put(rand_vec(kC, t, 0.1, 1.0, rng));
  CHECK_CUDA(cudaMemset(dtable.ptr, 0, dtable.bytes()));
  CHECK_CUDA(cudaMemset(dw.ptr, 0, dw.bytes()));
  CHECK_CUDA(cudaMemset(db.ptr, 0, db.bytes()));
  const std::string rc = fmt("[%" PRId64 ", %" PRId64 "]", kRowsGpt, kC);
  const std::string r4 = fmt("[%" PRId64 ", %" PRId64 "]", kRowsGpt, kC4);

  fa::EmbeddingParams ep;
  ep.rows = kRowsGpt;
  ep.vocab = kVocab;
  ep.dim = kC;
  ep.dtype = t;
  ep.ids = static_cast<const int32_t*>(ids.ptr);
  ep.table = table.ptr;
  ep.out = z.ptr;
  ep.dout = y.ptr;
  ep.dtable = dtable.f();
  bench("embedding_fwd", rc + " vocab 65", nc * e + kRowsGpt * 4.0, peak, [&] { return ops::embedding_fwd(ep, g_stream); });
  bench("embedding_bwd", rc + " vocab 65", nc * e + kRowsGpt * 4.0, peak, [&] { return ops::embedding_bwd(ep, g_stream); });

  for (bool ln : {false, true}) {
    fa::NormParams np;
    np.rows = kRowsGpt;
    np.cols = kC;
    np.dtype = t;
    np.layer_norm = ln;
    np.x = x.ptr;
    np.weight = w.ptr;
    np.bias = ln ? bias.ptr : nullptr;
    np.out = z.ptr;
    np.mean = mean.f();
    np.rstd = rstd.f();
    CHECK_CUDA(ops::norm_fwd(np, g_stream));
    np.dout = y.ptr;
    np.mean_in = mean.f();
    np.rstd_in = rstd.f();
    np.dx = z.ptr;
    np.dweight = dw.f();
    np.dbias = ln ? db.f() : nullptr;
    Workspace ws(ops::norm_bwd_workspace_bytes(np));
    np.workspace = ws.ptr;
    const char* fwd_name = ln ? "layer_norm_fwd" : "rms_norm_fwd";
    const char* bwd_name = ln ? "layer_norm_bwd" : "rms_norm_bwd";
    bench(fwd_name, rc, 2 * nc * e, peak, [&] { return ops::norm_fwd(np, g_stream); });
    bench(bwd_name, rc + " +dweight" + (ln ? " +dbias" : ""), 3 * nc * e, peak, [&] { return ops::norm_bwd(np, g_stream); });
  }

  fa::RopeParams rp;  // q of a packed [64, 256, 3, 6, 64] projection
  rp.batch = 64;
  rp.seqlen = 256;
  rp.heads = kHeads;
  rp.head_dim = kHeadDim;
  rp.batch_stride = 256 * 3 * kHeads * kHeadDim;
  rp.row_stride = 3 * kHeads * kHeadDim;
  rp.head_stride = kHeadDim;
  rp.dtype = t;
  rp.x = x.ptr;
  bench("rope", "q of [64, 256, 3, 6, 64]", 2 * nc * e, peak, [&] { return ops::rope(rp, g_stream); });

  fa::GeluParams gp;
  gp.numel = n4;
  gp.dtype = t;
  gp.x = x.ptr;
  gp.dout = y.ptr;
  gp.out = z.ptr;
  bench("gelu_fwd", r4, 2 * n4 * e, peak, [&] { return ops::gelu_fwd(gp, g_stream); });
  bench("gelu_bwd", r4, 3 * n4 * e, peak, [&] { return ops::gelu_bwd(gp, g_stream); });

  fa::SwigluParams sp;
  sp.rows = kRowsGpt;
  sp.cols = kC4;
  sp.dtype = t;
  sp.x = x.ptr;
  sp.dout = z.ptr;
  sp.out = z.ptr;
  bench("swiglu_fwd", fmt("[%" PRId64 ", 2 x %" PRId64 "]", kRowsGpt, kC4), 3 * n4 * e, peak,
        [&] { return ops::swiglu_fwd(sp, g_stream); });
  sp.out = y.ptr;
  bench("swiglu_bwd", fmt("[%" PRId64 ", 2 x %" PRId64 "]", kRowsGpt, kC4), 5 * n4 * e, peak,
        [&] { return ops::swiglu_bwd(sp, g_stream); });

  fa::AddParams ap;
  ap.numel = nc;
  ap.dtype = t;
  ap.a = z.ptr;
  ap.b = x.ptr;
  ap.out = z.ptr;
  bench("add (in place)", rc, 3 * nc * e, peak, [&] { return ops::add(ap, g_stream); });

  {
    Buf tg(DType::kInt32, kRowsGpt), loss(DType::kFloat32, 1);
    tg.put_ids(random_ids(kRowsGpt, kVocab, rng));
    fa::CrossEntropyParams cp;
    cp.rows = kRowsGpt;
    cp.vocab = kVocab;
    cp.dtype = t;
    cp.logits = x.ptr;
    cp.targets = static_cast<const int32_t*>(tg.ptr);
    cp.loss = loss.f();
    cp.dlogits = z.ptr;
    Workspace ws(ops::cross_entropy_workspace_bytes(cp));
    cp.workspace = ws.ptr;
    bench("cross_entropy", fmt("[%" PRId64 ", 65] mean +grad", kRowsGpt), 2.0 * kRowsGpt * kVocab * e + kRowsGpt * 4.0,
          peak, [&] { return ops::cross_entropy(cp, g_stream); });
  }

  {
    Buf param(t, kParams), master(DType::kFloat32, kParams), grad(DType::kFloat32, kParams), m(DType::kFloat32, kParams),
        v(DType::kFloat32, kParams), norm(DType::kFloat32, 1);
    grad.put(rand_vec(kParams, DType::kFloat32, 0.01, 1.0, rng));
    master.put(rand_vec(kParams, DType::kFloat32, 0.01, 1.0, rng));
    CHECK_CUDA(cudaMemset(m.ptr, 0, m.bytes()));
    CHECK_CUDA(cudaMemset(v.ptr, 0, v.bytes()));
    norm.put({1.0f});
    fa::AdamWParams p;
    p.numel = kParams;
    p.dtype = t;
    p.param = param.ptr;
    p.master = master.f();
    p.grad = grad.f();
    p.m = m.f();
    p.v = v.f();
    p.clip_norm = norm.f();
    p.max_norm = 1.0f;
    // reads grad, m, v, master (16 B); writes m, v, master (12 B) and the bf16 param (2 B)
    bench("adamw", "10.7M bf16 params, fp32 master", kParams * 30.0, peak, [&] { return ops::adamw(p, g_stream); });
    fa::NormOfParams np;
    const int64_t per = kParams / kParamTensors / 4 * 4;  // every tensor 16-byte aligned
    for (int i = 0; i < kParamTensors; ++i) {
      np.tensors.push_back(fa::TensorSpan{grad.f() + i * per, per, DType::kFloat32});
    }
    np.out = norm.f();
    Workspace ws(ops::norm_of_workspace_bytes(np));
    np.workspace = ws.ptr;
    bench("norm_of", "75 fp32 gradients, 10.7M elements", kParams * 4.0, peak, [&] { return ops::norm_of(np, g_stream); });
  }

  {
    Workspace ws(ops::column_sum_workspace_bytes(fa::ColumnSumParams{kRowsGpt, kC4, t, nullptr, nullptr, true, nullptr}));
    fa::ColumnSumParams cp{kRowsGpt, kC4, t, x.ptr, db.f(), true, ws.ptr};
    bench("column_sum", r4, n4 * e, peak, [&] { return ops::column_sum(cp, g_stream); });
    fa::SumParams sp2{nc, t, x.ptr, db.f(), nullptr};
    Workspace ws2(ops::sum_workspace_bytes(sp2));
    sp2.workspace = ws2.ptr;
    bench("sum", rc, nc * e, peak, [&] { return ops::sum(sp2, g_stream); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  const CheckSetup setup = check_setup(argc, argv, "ops_check", true);
  Rng rng(setup.seed);
  // A blocking stream: Buf's cudaMemcpy / cudaMemset run on the legacy default stream, and a pageable
  // host-to-device cudaMemcpy may return before its DMA lands. With a non-blocking stream a kernel
  // could read a buffer before its upload finished: the embedding backward's "differs between two
  // runs" failures (re-uploaded dtable, 1 MB and up) came from that race, not from the kernel.
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamDefault));
  if (setup.run_checks) {
    const auto fits = [](int64_t rows, int64_t cols) { return rows * cols <= kMaxCaseElems; };
    // Misaligned variants on the smaller shapes (the scalar paths do not depend on size).
    const auto mis_too = [](int64_t rows, int64_t cols) { return rows * cols <= (int64_t{1} << 17); };
    for (DType t : kDtypes) {
      for (int64_t rows : kRows)
        for (int64_t cols : kCols) {
          if (!fits(rows, cols)) continue;
          for (bool mis : {false, true}) {
            if (mis && !mis_too(rows, cols)) continue;
            for (NormKind k : {NormKind::kRms, NormKind::kLayerBias, NormKind::kLayerNoBias})
              check_norm(t, k, rows, cols, mis, rng);
            check_swiglu(t, rows, cols, mis, rng);
            check_column_sum(t, rows, cols, cols % 2 == 1, mis, rng);  // += and =
            check_embedding(t, rows, cols, 65, mis, rng);
          }
        }
      // GPT-2's vocabulary: the vocabulary-range policy of the embedding backward, block-per-row loss.
      for (int64_t rows : {7, 1025, 16384})
        for (int64_t dim : {3, 65, 384}) check_embedding(t, rows, dim, 50257, false, rng);
      check_embedding(t, 97, 65, 50257, true, rng);
      check_embedding(t, 97, 129, 513, false, rng);  // just past the row-group policy

      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{65}, int64_t{4099}, int64_t{97 * 129}, int64_t{16384 * 384}})
        for (bool mis : {false, true}) {
          if (mis && n > (int64_t{1} << 17)) continue;
          check_gelu(t, n, mis, rng);
          check_add(t, n, 1.0f, false, mis, rng);
          check_add(t, n, -0.75f, true, mis, rng);
          check_sum(t, n, mis, rng);
          check_adamw(t, n, n % 2 == 1, mis, rng);
          if (n == 4099) check_adamw(t, n, false, mis, rng);
          if (n == 65) check_adamw(t, n, true, mis, rng, true);
        }

      for (int64_t vocab : {int64_t{3}, int64_t{65}, int64_t{129}, int64_t{4099}, int64_t{50257}})
        for (int64_t rows : kRows) {
          if (!fits(rows, vocab) || (vocab == 50257 && rows > 97)) continue;
          for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean})
            check_cross_entropy(t, rows, vocab, red, true, Targets::kWithIgnored, false, rng);
          check_cross_entropy(t, rows, vocab, Reduction::kMean, false, Targets::kWithIgnored, false, rng);
          if (rows <= 1025) {
            check_cross_entropy(t, rows, vocab, Reduction::kMean, true, Targets::kWithInvalid, true, rng);
            check_cross_entropy(t, rows, vocab, Reduction::kSum, true, Targets::kWithInvalid, false, rng);
            check_cross_entropy(t, rows, vocab, Reduction::kMean, true, Targets::kAllIgnored, false, rng);
          }
        }

      // RoPE on q and k inside packed projections: tiny, odd, the GPT's (64 x 256 x 6 heads x 64).
      for (int slot : {0, 1}) {
        check_rope(t, 1, 1, 1, 2, slot, false, 0, 10000.0f, rng);
        check_rope(t, 2, 7, 3, 8, slot, slot == 1, 5, 10000.0f, rng);
        check_rope(t, 3, 97, 2, 34, slot, false, 1000, 500000.0f, rng);
        check_rope(t, 2, 129, 4, 64, slot, true, 0, 10000.0f, rng);
      }
      check_rope(t, 64, 256, 6, 64, 0, false, 0, 10000.0f, rng);
      check_rope(t, 64, 256, 6, 64, 1, true, 0, 10000.0f, rng);
    }
    // norm_of: mixed dtypes and misaligned views; more tensors than one launch takes (64).
    check_norm_of({{DType::kFloat32, 1, false}}, "one element", rng);
    check_norm_of({{DType::kFloat32, 384 * 1536, false},
                   {DType::kBFloat16, 4099, true},
                   {DType::kFloat16, 65, false},
                   {DType::kFloat32, 3, true},
                   {DType::kBFloat16, 384, false}},
                  "mixed dtypes, misaligned", rng);
    std::vector<SpanSpec> many;
    for (int i = 0; i < 150; ++i) many.push_back({kDtypes[i % 3], 1 + 37 * i, i % 4 == 3});
    check_norm_of(many, "three launches of partials", rng);
    std::printf("ops_check: %d cases, %d failed\n", g_cases, g_failed);
  }
  if (setup.run_bench && g_failed == 0) run_bench(rng);
  CHECK_CUDA(cudaStreamDestroy(g_stream));
  return g_failed == 0 ? 0 : 1;
}
