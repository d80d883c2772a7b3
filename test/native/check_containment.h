// The non-finite containment checks shared by the backward's native checks (flash_bwd_check.cu and
// flash_bwd_fp32_check.cu): what standard attention makes of one NaN / ±Inf in q, k or dout, element by
// element (containment_pattern, the rules of those files' comments), and the comparison of a poisoned
// call's outputs against it (count_wrong). Case is the including file's case type (batch, sq, sk, hq,
// hkv, d, causal), with a visible_keys(c, i) beside it.
#pragma once
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

constexpr size_t kShownViolations = 8;  // wrong elements printed per failing containment case

// What an output element of a poisoned call must hold.
enum class Expect : uint8_t {
  kSame,       // the clean call's value, bit for bit (dq through fp32 atomics: see kAtomicDqFloor)
  kNonFinite,  // NaN or +-inf
  kAny,        // not checked (rows whose score with a -inf key is -inf: see containment_pattern)
};

const char* expect_name(Expect e) {
  return e == Expect::kSame ? "the clean value" : e == Expect::kNonFinite ? "non-finite" : "anything";
}

enum class Operand { kQ, kK, kDout };

const char* operand_name(Operand o) { return o == Operand::kQ ? "q" : o == Operand::kK ? "k" : "dout"; }

// operand[batch, row, head, col] = value; row and head are a query row and a query head for q and dout,
// a key and a KV head for k.
struct Poison {
  Operand operand;
  int64_t batch, row, head, col;
  float value;
};

const char* value_name(float x) { return std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf"; }

// The expected class of every output element of a poisoned call, in the layouts of q (out, dq), k (dk,
// dv) and lse.
struct Pattern {
  std::vector<Expect> out, lse, dq, dk, dv;
};

// Standard attention's reach of `poison` (causal, bottom-right; the rules of the file comment): the query
// rows whose results it makes non-finite, the keys those rows see, and kSame everywhere else.
template <typename Case>
Pattern containment_pattern(const Case& c, const Poison& poison) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  Pattern pat{std::vector<Expect>(nq, Expect::kSame), std::vector<Expect>(c.batch * c.hq * c.sq, Expect::kSame),
              std::vector<Expect>(nq, Expect::kSame), std::vector<Expect>(nk, Expect::kSame),
              std::vector<Expect>(nk, Expect::kSame)};
  const int64_t group = c.hq / c.hkv, b = poison.batch;
  const bool in_k = poison.operand == Operand::kK;
  const int64_t kvh = in_k ? poison.head : poison.head / group;
  // -inf in k scores -inf with every row that sees its key (run_containment_cases makes their q column
  // positive): standard attention drops the key from those rows, which changes their results without
  // making them non-finite, and arithmetic that splits -inf (3xTF32, 'highest', into -inf and NaN) may
  // give NaN there instead; only the elements outside that reach are checked.
  const Expect reach = in_k && std::isinf(poison.value) && poison.value < 0 ? Expect::kAny : Expect::kNonFinite;
  int64_t keys = 0;  // the rows reached see keys [0, keys) of KV head kvh (causal: a prefix)
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int64_t i = 0; i < c.sq; ++i) {
      const int64_t n = visible_keys(c, i);
      // k: every row that sees the key. q, dout: the poisoned row, unless it sees no key (then its dq
      // stays 0 and it adds nothing to dk / dv).
      const bool reached = in_k ? poison.row < n : h == poison.head && i == poison.row && n > 0;
      if (!reached) continue;
      const int64_t qo = ((b * c.sq + i) * c.hq + h) * c.d;
      std::fill_n(pat.dq.begin() + qo, c.d, reach);
      if (poison.operand != Operand::kDout) {  // dout is no input of the forward
        std::fill_n(pat.out.begin() + qo, c.d, reach);
        pat.lse[(b * c.hq + h) * c.sq + i] = reach;
      }
      keys = std::max(keys, n);
    }
  for (int64_t j = 0; j < keys; ++j) {
    const int64_t ko = ((b * c.sk + j) * c.hkv + kvh) * c.d;
    std::fill_n(pat.dk.begin() + ko, c.d, reach);
    // dv_j = sum_i P_ij dout_i: a poisoned dout reaches its own column only; q and k reach P itself.
    if (poison.operand == Operand::kDout)
      pat.dv[ko + poison.col] = reach;
    else
      std::fill_n(pat.dv.begin() + ko, c.d, reach);
  }
  return pat;
}

int64_t count_nonfinite(const std::vector<float>& v) {
  return std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
}

// Bit identity of two floats (+0 and -0 differ; fp16 / bf16 values convert to float one to one).
bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }

// Checks output `name` of a poisoned call (`got`) against `want` element by element, `clean` being the
// clean call's; returns how many elements break it and appends the first kShownViolations of all
// outputs to `shown`. same(clean, got) decides kSame. rows, heads, d: the [B, rows, heads, d] layout,
// or d = 0 for lse [B, heads, rows].
template <typename Same>
int64_t count_wrong(const char* name, const std::vector<float>& clean, const std::vector<float>& got,
                    const std::vector<Expect>& want, int64_t rows, int64_t heads, int64_t d, Same same,
                    std::vector<std::string>* shown) {
  int64_t wrong = 0;
  for (size_t x = 0; x < got.size(); ++x) {
    const bool ok = want[x] == Expect::kSame        ? same(clean[x], got[x])
                    : want[x] == Expect::kNonFinite ? !std::isfinite(got[x])
                                                    : true;
    if (ok) continue;
    ++wrong;
    if (shown->size() >= kShownViolations) continue;
    const int64_t i = static_cast<int64_t>(x);
    char line[160];
    if (d == 0)
      std::snprintf(line, sizeof line, "%s[b%" PRId64 ",h%" PRId64 ",row%" PRId64 "]", name, i / (heads * rows),
                    i / rows % heads, i % rows);
    else
      std::snprintf(line, sizeof line, "%s[b%" PRId64 ",row%" PRId64 ",h%" PRId64 ",c%" PRId64 "]", name,
                    i / (rows * heads * d), i / (heads * d) % rows, i / d % heads, i % d);
    std::string s = line;
    std::snprintf(line, sizeof line, ": want %s, got %.9g (clean %.9g)", expect_name(want[x]), got[x], clean[x]);
    shown->push_back(s + line);
  }
  return wrong;
}

// The wrong elements of each output of a poisoned call (count_wrong; dq by `exact` when the backward's dq
// is bit-identical run to run, by `near` otherwise), how many elements the pattern wants non-finite and
// leaves unchecked, and where the poison reaches in standard attention (for the output line).
struct ContainmentCounts {
  int64_t out = 0, lse = 0, dq = 0, dk = 0, dv = 0, wanted = 0, unchecked = 0;
  char reach[64] = {};
  int64_t wrong() const { return out + lse + dq + dk + dv; }
};

template <typename Case, typename Outputs, typename Exact, typename Near>
ContainmentCounts count_containment(const Case& c, const Poison& poison, const Outputs& clean, const Outputs& got,
                                    const Pattern& want, bool dq_bits, Exact exact, Near near,
                                    std::vector<std::string>* shown) {
  ContainmentCounts n;
  n.out = count_wrong("out", clean.out, got.out, want.out, c.sq, c.hq, c.d, exact, shown);
  n.lse = count_wrong("lse", clean.lse, got.lse, want.lse, c.sq, c.hq, 0, exact, shown);
  n.dq = dq_bits ? count_wrong("dq", clean.dq, got.dq, want.dq, c.sq, c.hq, c.d, exact, shown)
                 : count_wrong("dq", clean.dq, got.dq, want.dq, c.sq, c.hq, c.d, near, shown);
  n.dk = count_wrong("dk", clean.dk, got.dk, want.dk, c.sk, c.hkv, c.d, exact, shown);
  n.dv = count_wrong("dv", clean.dv, got.dv, want.dv, c.sk, c.hkv, c.d, exact, shown);
  for (const auto* p : {&want.out, &want.lse, &want.dq, &want.dk, &want.dv}) {
    n.wanted += std::count(p->begin(), p->end(), Expect::kNonFinite);
    n.unchecked += std::count(p->begin(), p->end(), Expect::kAny);
  }
  if (poison.operand == Operand::kK) {
    std::snprintf(n.reach, sizeof n.reach, "seen by rows %" PRId64 "-%" PRId64,
                  std::max<int64_t>(poison.row - (c.sk - c.sq), 0), c.sq - 1);
  } else if (visible_keys(c, poison.row) == 0) {
    std::snprintf(n.reach, sizeof n.reach, "sees no key");
  } else {
    std::snprintf(n.reach, sizeof n.reach, "sees keys 0-%" PRId64, visible_keys(c, poison.row) - 1);
  }
  return n;
}

// Non-finite elements of out, dq, dk and dv (a clean call must have none).
template <typename Outputs>
int64_t count_nonfinite_outputs(const Outputs& o) {
  return count_nonfinite(o.out) + count_nonfinite(o.dq) + count_nonfinite(o.dk) + count_nonfinite(o.dv);
}

// ±inf in column kc of k must score ±inf with every row that sees its key: that column of q (batch b)
// made positive in KV head hk's query heads.
template <typename Case>
void make_q_column_positive(const Case& c, std::vector<float>& q, int64_t b, int64_t hk, int64_t kc) {
  const int64_t group = c.hq / c.hkv;
  for (int64_t hh = hk * group; hh < (hk + 1) * group; ++hh)
    for (int64_t i = 0; i < c.sq; ++i) {
      float& x = q[((b * c.sq + i) * c.hq + hh) * c.d + kc];
      x = std::fabs(x);
    }
}

// The poisons of one containment shape (batch b, query head h, KV head hk): NaN and +inf in q (column qc)
// and dout (column dc) of query row s.row, NaN and ±inf in k (column kc) of key s.key, and NaN in q and
// dout of a row that sees no key when the shape has one (s.empty_row >= 0).
template <typename Shape>
std::vector<Poison> containment_poisons(const Shape& s, int64_t b, int64_t h, int64_t hk, int64_t qc, int64_t kc,
                                        int64_t dc) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<Poison> poisons = {
      {Operand::kQ, b, s.row, h, qc, nan},      {Operand::kQ, b, s.row, h, qc, inf},
      {Operand::kK, b, s.key, hk, kc, nan},     {Operand::kK, b, s.key, hk, kc, inf},
      {Operand::kK, b, s.key, hk, kc, -inf},    {Operand::kDout, b, s.row, h, dc, nan},
      {Operand::kDout, b, s.row, h, dc, inf},
  };
  if (s.empty_row >= 0) {
    poisons.push_back({Operand::kQ, b, s.empty_row, h, qc, nan});
    poisons.push_back({Operand::kDout, b, s.empty_row, h, dc, nan});
  }
  return poisons;
}
