// A Mamba-2 block over a sequence on a CPU, forward and backward
// (looplab/models/cpu/cpu_sequence.py): the SSM scan token by token, and the causal
// depthwise conv with its SiLU.
//
// The scan, per head h, with scalar decay A_h < 0 and state S (headdim x d_state):
//     S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T,    y_t = S_t C_t
// On a small model the chunked form (ops/ssd.py) spends its time on Q x Q decay
// matrices and batches of tiny matrix products; the recurrence itself is a few
// vector operations per token and head, and a state of headdim x d_state values
// stays in L1. So here it runs as written, one (batch row, head) per task.
//
// Its backward runs the recurrence in reverse. It needs each S_{t-1}: the forward keeps
// the state every `span` tokens, and the backward recomputes the states of one
// span from its checkpoint into a small buffer before walking it backwards, so the
// memory is (tokens / span) states, not one a token.
//
// A row may pack several sequences (seq_idx, non-decreasing): the state is reset to
// zero where seq_idx changes, no gradient flows back across that point, and no conv
// tap reads across it. No fast-math: the tests compare float64 against the oracles.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <type_traits>
#include <vector>

namespace {

struct Dims {
  int64_t batch, len, heads, headdim, groups, d_state, span;  // span: tokens between checkpoints
  int64_t spans() const { return (len + span - 1) / span; }
};

// Whether the state is reset to zero before token t of row b.
inline bool resets(const int64_t* seq, const Dims& d, int64_t b, int64_t t) {
  return seq && t > 0 && seq[b * d.len + t] != seq[b * d.len + t - 1];
}

// One token of one head's state, headdim-major: next = a prev + (dt x) B^T. NS > 0 is d_state known at compile time (the common sizes: the loops unroll
// into vector registers), 0 reads it from N_.
template <typename T, int NS, int PS>
inline void advance(const T* __restrict__ prev, T* __restrict__ next, const T* __restrict__ x, T dt, T a,
                    const T* __restrict__ B, int64_t P_, int64_t N_) {
  const int64_t N = NS ? NS : N_, P = PS ? PS : P_;
  for (int64_t p = 0; p < P; ++p) {
    const T* __restrict__ from = prev + p * N;
    T* __restrict__ row = next + p * N;
    const T xdt = dt * x[p];
#pragma omp simd
    for (int64_t n = 0; n < N; ++n) row[n] = a * from[n] + xdt * B[n];
  }
}

// The forward keeps its running state transposed, d_state-major (ST[n][p] = S[p][n]),
// so that y = S C accumulates as vectors over headdim, with no sum across a vector's
// lanes per row; the checkpoints and the final state are stored headdim-major.
template <typename T, int NS, int PS>
void forward(const Dims& d, const T* x, const T* dt, const T* A, const T* B, const T* C, const int64_t* seq,
             const T* init, T* y, T* final_state, T* checkpoints) {
  const int64_t P = PS ? PS : d.headdim, N = NS ? NS : d.d_state, H = d.heads, G = d.groups, hpg = H / G, PN = P * N;
  at::parallel_for(0, d.batch * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> state(PN), inputs(P);
    T* __restrict__ ST = state.data();
    T* __restrict__ xdt = inputs.data();
    const auto store = [&](T* out) {  // ST, transposed back to (headdim, d_state)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t n = 0; n < N; ++n) out[p * N + n] = ST[n * P + p];
    };
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / hpg;
      if (init) {
        for (int64_t p = 0; p < P; ++p)
          for (int64_t n = 0; n < N; ++n) ST[n * P + p] = init[bh * PN + p * N + n];
      } else {
        std::fill(ST, ST + PN, T(0));
      }
      for (int64_t t = 0; t < d.len; ++t) {
        if (resets(seq, d, b, t)) std::fill(ST, ST + PN, T(0));
        if (t % d.span == 0) store(checkpoints + (bh * d.spans() + t / d.span) * PN);
        const int64_t bt = b * d.len + t;
        const T step = dt[bt * H + h], a = std::exp(step * A[h]);
        const T* __restrict__ xt = x + (bt * H + h) * P;
        const T* __restrict__ Bt = B + (bt * G + g) * N;
        const T* __restrict__ Ct = C + (bt * G + g) * N;
        T* __restrict__ yt = y + (bt * H + h) * P;
#pragma omp simd
        for (int64_t p = 0; p < P; ++p) {
          xdt[p] = step * xt[p];
          yt[p] = 0;
        }
        for (int64_t n = 0; n < N; ++n) {
          T* __restrict__ col = ST + n * P;
          const T bn = Bt[n], cn = Ct[n];
#pragma omp simd
          for (int64_t p = 0; p < P; ++p) {
            const T v = a * col[p] + bn * xdt[p];
            col[p] = v;
            yt[p] += v * cn;
          }
        }
      }
      store(final_state + bh * PN);
    }
  });
}

// One token of one head, backwards: with G = carry G + dy C^T (dL/dS_t, through S_{t+1}
// and through y_t), writes dx, sets dB_sum = G^T (dt x), dC_sum = S_t^T dy and
// da_sum = the lanes of <G, S_{t-1}>, and returns dL/d(dt) through the input term.
template <typename T, int NS, int PS>
inline T token_backward(T* __restrict__ Gs, const T* __restrict__ S_t, const T* __restrict__ S_prev,
                        const T* __restrict__ xt, const T* __restrict__ Bt, const T* __restrict__ Ct,
                        const T* __restrict__ dyt, T step, T carry, T* __restrict__ dxt, T* __restrict__ dB_sum,
                        T* __restrict__ dC_sum, T* __restrict__ da_sum, int64_t P_, int64_t N_) {
  const int64_t N = NS ? NS : N_, P = PS ? PS : P_;
  for (int64_t n = 0; n < N; ++n) dB_sum[n] = dC_sum[n] = da_sum[n] = 0;
  T dstep = 0;
  for (int64_t p = 0; p < P; ++p) {
    T* __restrict__ gr = Gs + p * N;
    const T* __restrict__ s = S_t + p * N;
    const T* __restrict__ sp = S_prev + p * N;
    const T dyp = dyt[p], xdtp = step * xt[p];
    T dxdt = 0;
#pragma omp simd reduction(+ : dxdt)
    for (int64_t n = 0; n < N; ++n) {
      const T gv = carry * gr[n] + dyp * Ct[n];
      gr[n] = gv;
      dC_sum[n] += s[n] * dyp;
      dB_sum[n] += gv * xdtp;
      da_sum[n] += gv * sp[n];
      dxdt += gv * Bt[n];
    }
    dxt[p] = dxdt * step;
    dstep += dxdt * xt[p];
  }
  return dstep;
}

// Gradients of one (row, group): its heads in turn, so that dB and dC, which the heads
// of a group share, are summed without races. dA is per (row, head), summed by the caller.
template <typename T, int NS, int PS>
void backward(const Dims& d, const T* x, const T* dt, const T* A, const T* B, const T* C, const int64_t* seq,
              const T* checkpoints, const T* dy, const T* dfinal, T* dx, T* ddt, T* dA, T* dB, T* dC, T* dinit) {
  const int64_t P = PS ? PS : d.headdim, N = NS ? NS : d.d_state, H = d.heads, G = d.groups, hpg = H / G, PN = P * N;
  at::parallel_for(0, d.batch * G, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> states((d.span + 1) * PN), grad(PN), sums(3 * N), zeros(PN);
    T* dB_sum = sums.data();  // one token's sums over headdim (token_backward)
    T* dC_sum = dB_sum + N;
    T* da_sum = dC_sum + N;
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
        const int64_t bh = b * H + h;
        T* __restrict__ Gs = grad.data();  // dL/dS_t, carried backwards, times `carry` (applied lazily)
        if (dfinal) std::copy(dfinal + bh * PN, dfinal + (bh + 1) * PN, Gs);
        else std::fill(Gs, Gs + PN, T(0));
        T carry = 1, dA_h = 0;
        for (int64_t piece = d.spans() - 1; piece >= 0; --piece) {
          const int64_t t0 = piece * d.span, t1 = std::min(d.len, t0 + d.span);
          // states[0] is the state token t0 starts from (the checkpoint, after any reset
          // at t0); states[k + 1] the state after token t0 + k.
          const T* saved = checkpoints + (bh * d.spans() + piece) * PN;
          std::copy(saved, saved + PN, states.data());
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t k = t - t0, bt = b * d.len + t;
            T* next = states.data() + (k + 1) * PN;
            const T step = dt[bt * H + h];
            const T* prev = k > 0 && resets(seq, d, b, t) ? zeros.data() : next - PN;  // a reset starts from zero
            advance<T, NS, PS>(prev, next, x + (bt * H + h) * P, step, std::exp(step * A[h]), B + (bt * G + g) * N, P, N);
          }
          for (int64_t t = t1 - 1; t >= t0; --t) {
            const int64_t bt = b * d.len + t, k = t - t0;
            const T* __restrict__ S_t = states.data() + (k + 1) * PN;
            const T* __restrict__ S_prev = states.data() + k * PN;  // what S_t decayed from, unless reset at t
            const bool reset = resets(seq, d, b, t);
            const T step = dt[bt * H + h], a = std::exp(step * A[h]);
            const T* __restrict__ xt = x + (bt * H + h) * P;
            const T* __restrict__ Bt = B + (bt * G + g) * N;
            const T* __restrict__ Ct = C + (bt * G + g) * N;
            const T* __restrict__ dyt = dy + (bt * H + h) * P;
            const T dstep = token_backward<T, NS, PS>(Gs, S_t, S_prev, xt, Bt, Ct, dyt, step, carry,
                                                  dx + (bt * H + h) * P, dB_sum, dC_sum, da_sum, P, N);
            T da = 0;
            T* __restrict__ dBt = dB + (bt * G + g) * N;
            T* __restrict__ dCt = dC + (bt * G + g) * N;
            for (int64_t n = 0; n < N; ++n) {
              dBt[n] += dB_sum[n];
              dCt[n] += dC_sum[n];
              da += da_sum[n];
            }
            if (reset) da = 0;  // S_{t-1} did not enter S_t
            ddt[bt * H + h] = dstep + da * a * A[h];
            dA_h += da * a * step;
            carry = reset ? T(0) : a;  // dL/dS_{t-1} = carry * dL/dS_t
          }
        }
        dA[bh] = dA_h;
        if (dinit)
          for (int64_t i = 0; i < PN; ++i) dinit[bh * PN + i] = carry * Gs[i];
      }
    }
  });
}

// Runs body(NS, PS) with d_state and headdim known at compile time where they are a
// common pair, d_state alone where it is a common size, else neither (0: read at run time).
// The backward takes d_state alone: with headdim compiled in too, its dC came out wrong at
// (16, 16) under GCC 12 (tests/test_cpu_sequence.py caught it; the cause is not found),
// and it had gained only 5 %.
template <typename F>
void with_sizes(int64_t n, int64_t p, F&& body) {
  using std::integral_constant;
  if (n == 16 && p == 16) return body(integral_constant<int, 16>{}, integral_constant<int, 16>{});
  if (n == 32 && p == 32) return body(integral_constant<int, 32>{}, integral_constant<int, 32>{});
  if (n == 64 && p == 64) return body(integral_constant<int, 64>{}, integral_constant<int, 64>{});
  if (n == 128 && p == 64) return body(integral_constant<int, 128>{}, integral_constant<int, 64>{});
  switch (n) {
    case 16: return body(integral_constant<int, 16>{}, integral_constant<int, 0>{});
    case 32: return body(integral_constant<int, 32>{}, integral_constant<int, 0>{});
    case 64: return body(integral_constant<int, 64>{}, integral_constant<int, 0>{});
    case 128: return body(integral_constant<int, 128>{}, integral_constant<int, 0>{});
    default: return body(integral_constant<int, 0>{}, integral_constant<int, 0>{});
  }
}

// ---- the causal depthwise conv and its SiLU ------------------------------------------
// out[b, t, c] = silu(bias[c] + sum_j w[c, j] x[b, t - (k - 1) + j, c]), a tap before the
// row's start or in another sequence than token t's (seq_idx) reading zero: ops/conv.py's
// causal_depthwise_conv followed by F.silu, in one pass over channels-last rows. Tasks
// split the channels, so the weight gradients are summed without races.

struct ConvDims {
  int64_t batch, len, channels, k;
};

// Channel blocks per task: vector-wide, and enough of them for the threads.
constexpr int64_t CONV_BLOCK = 64;

inline bool same_sequence(const int64_t* seq, int64_t row, int64_t len, int64_t t, int64_t s) {
  return !seq || seq[row * len + t] == seq[row * len + s];
}

// SiLU and its derivative over `width` values, in ATen's vector type (its exp is Sleef's,
// within 1 ulp; the C library's scalar exp does not vectorise, and a SiLU per element
// is most of the conv's time): out = v sigmoid(v); g <- dy sigmoid(v) (1 + v (1 - sigmoid(v))).
template <typename T>
void silu(const T* v, T* out, int64_t width) {
  using Vec = at::vec::Vectorized<T>;
  const Vec one(T(1));
  int64_t c = 0;
  for (; c + Vec::size() <= width; c += Vec::size()) {
    const Vec x = Vec::loadu(v + c);
    (x / (one + x.neg().exp())).store(out + c);
  }
  for (; c < width; ++c) out[c] = v[c] / (T(1) + std::exp(-v[c]));
}

template <typename T>
void silu_backward(T* g, const T* dy, int64_t width) {
  using Vec = at::vec::Vectorized<T>;
  const Vec one(T(1));
  int64_t c = 0;
  for (; c + Vec::size() <= width; c += Vec::size()) {
    const Vec x = Vec::loadu(g + c), s = one / (one + x.neg().exp());
    (Vec::loadu(dy + c) * s * (one + x * (one - s))).store(g + c);
  }
  for (; c < width; ++c) {
    const T s = T(1) / (T(1) + std::exp(-g[c]));
    g[c] = dy[c] * s * (T(1) + g[c] * (T(1) - s));
  }
}

// The taps of channels [c0, c1), tap-major (k, c1 - c0): contiguous along the channels
// that the loops vectorise over (the weight is (channels, 1, k)).
template <typename T>
void taps_of(const ConvDims& d, const T* w, int64_t c0, int64_t c1, T* taps) {
  for (int64_t j = 0; j < d.k; ++j)
    for (int64_t c = c0; c < c1; ++c) taps[j * (c1 - c0) + c - c0] = w[c * d.k + j];
}

// The conv before its SiLU, for tokens [0, len) of row b and channels [c0, c1), into pre (len, c1 - c0).
template <typename T>
void conv_row(const ConvDims& d, const T* x, const T* taps, const T* bias, const int64_t* seq, int64_t b,
              int64_t c0, int64_t c1, T* __restrict__ pre) {
  const int64_t width = c1 - c0;
  for (int64_t t = 0; t < d.len; ++t) {
    T* __restrict__ out = pre + t * width;
    for (int64_t c = 0; c < width; ++c) out[c] = bias ? bias[c0 + c] : T(0);
    for (int64_t j = 0; j < d.k; ++j) {
      const int64_t s = t - (d.k - 1) + j;
      if (s < 0 || !same_sequence(seq, b, d.len, t, s)) continue;
      const T* __restrict__ in = x + (b * d.len + s) * d.channels + c0;
      const T* __restrict__ tap = taps + j * width;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) out[c] += tap[c] * in[c];
    }
  }
}

template <typename T>
void conv_forward(const ConvDims& d, const T* x, const T* w, const T* bias, const int64_t* seq, T* y) {
  const int64_t blocks = (d.channels + CONV_BLOCK - 1) / CONV_BLOCK;
  at::parallel_for(0, d.batch * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> pre(d.len * CONV_BLOCK), taps(d.k * CONV_BLOCK);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / blocks, c0 = (task % blocks) * CONV_BLOCK, c1 = std::min(d.channels, c0 + CONV_BLOCK);
      const int64_t width = c1 - c0;
      taps_of(d, w, c0, c1, taps.data());
      conv_row(d, x, taps.data(), bias, seq, b, c0, c1, pre.data());
      for (int64_t t = 0; t < d.len; ++t) silu(pre.data() + t * width, y + (b * d.len + t) * d.channels + c0, width);
    }
  });
}

// dy through the SiLU (recomputing the conv) and back through the taps: dx, and dw and
// dbias summed over every row and token of the task's channels.
template <typename T>
void conv_backward(const ConvDims& d, const T* x, const T* w, const T* bias, const int64_t* seq, const T* dy, T* dx,
                   T* dw, T* dbias) {
  const int64_t blocks = (d.channels + CONV_BLOCK - 1) / CONV_BLOCK;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> pre(d.len * CONV_BLOCK), taps(d.k * CONV_BLOCK), dtaps(d.k * CONV_BLOCK), dbias_block(CONV_BLOCK);
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * CONV_BLOCK, c1 = std::min(d.channels, c0 + CONV_BLOCK), width = c1 - c0;
      taps_of(d, w, c0, c1, taps.data());
      std::fill(dtaps.begin(), dtaps.end(), T(0));
      std::fill(dbias_block.begin(), dbias_block.end(), T(0));
      for (int64_t b = 0; b < d.batch; ++b) {
        conv_row(d, x, taps.data(), bias, seq, b, c0, c1, pre.data());
        for (int64_t t = 0; t < d.len; ++t)  // pre becomes dL/dpre
          silu_backward(pre.data() + t * width, dy + (b * d.len + t) * d.channels + c0, width);
        for (int64_t s = 0; s < d.len; ++s) {
          T* __restrict__ dxs = dx + (b * d.len + s) * d.channels + c0;
          const T* __restrict__ xs = x + (b * d.len + s) * d.channels + c0;
          const T* __restrict__ g_s = pre.data() + s * width;
          T* __restrict__ db = dbias_block.data();
#pragma omp simd
          for (int64_t c = 0; c < width; ++c) {
            dxs[c] = 0;
            db[c] += g_s[c];
          }
          for (int64_t j = 0; j < d.k; ++j) {
            const int64_t t = s + (d.k - 1) - j;  // the token whose tap j reads token s
            if (t >= d.len || !same_sequence(seq, b, d.len, t, s)) continue;
            const T* __restrict__ g = pre.data() + t * width;
            const T* __restrict__ tap = taps.data() + j * width;
            T* __restrict__ dtap = dtaps.data() + j * width;
#pragma omp simd
            for (int64_t c = 0; c < width; ++c) {
              dxs[c] += tap[c] * g[c];
              dtap[c] += g[c] * xs[c];
            }
          }
        }
      }
      for (int64_t c = c0; c < c1; ++c) {
        dbias[c] = dbias_block[c - c0];
        for (int64_t j = 0; j < d.k; ++j) dw[c * d.k + j] = dtaps[j * width + c - c0];
      }
    }
  });
}

Dims dims_of(const torch::Tensor& x, const torch::Tensor& B, int64_t span) {
  TORCH_CHECK(x.dim() == 4 && B.dim() == 4, "x (b, l, h, p) and B (b, l, g, n)");
  TORCH_CHECK(span > 0, "span must be positive");
  Dims d{x.size(0), x.size(1), x.size(2), x.size(3), B.size(2), B.size(3), span};
  TORCH_CHECK(d.heads % d.groups == 0, "heads must split into groups");
  return d;
}

void check(const torch::Tensor& t, const torch::Tensor& like, std::vector<int64_t> shape, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type(), name,
              " must be a contiguous CPU tensor of ", like.scalar_type());
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), name, " has shape ", t.sizes(), ", expected ", at::IntArrayRef(shape));
}

const int64_t* seq_ptr(const c10::optional<torch::Tensor>& seq, const Dims& d) {
  if (!seq) return nullptr;
  TORCH_CHECK(seq->scalar_type() == torch::kLong && seq->is_contiguous() && seq->sizes() == at::IntArrayRef({d.batch, d.len}),
              "seq_idx must be contiguous int64 (b, l)");
  return seq->data_ptr<int64_t>();
}

}  // namespace

// Returns y (b, l, h, p), the final state (b, h, p, n) and the checkpoints the backward reads.
std::vector<torch::Tensor> scan_forward(torch::Tensor x, torch::Tensor dt, torch::Tensor A, torch::Tensor B,
                                        torch::Tensor C, c10::optional<torch::Tensor> seq_idx,
                                        c10::optional<torch::Tensor> initial_state, int64_t span) {
  const Dims d = dims_of(x, B, span);
  check(x, x, {d.batch, d.len, d.heads, d.headdim}, "x");
  check(dt, x, {d.batch, d.len, d.heads}, "dt");
  check(A, x, {d.heads}, "A");
  check(B, x, {d.batch, d.len, d.groups, d.d_state}, "B");
  check(C, x, {d.batch, d.len, d.groups, d.d_state}, "C");
  if (initial_state) check(*initial_state, x, {d.batch, d.heads, d.headdim, d.d_state}, "initial_state");
  auto y = torch::empty_like(x);
  auto final_state = torch::empty({d.batch, d.heads, d.headdim, d.d_state}, x.options());
  auto checkpoints = torch::empty({d.batch, d.heads, d.spans(), d.headdim, d.d_state}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scan_forward", [&] {
    with_sizes(d.d_state, d.headdim, [&](auto NS, auto PS) {
    forward<scalar_t, decltype(NS)::value, decltype(PS)::value>(d, x.data_ptr<scalar_t>(), dt.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
                      B.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(), seq_ptr(seq_idx, d),
                      initial_state ? initial_state->data_ptr<scalar_t>() : nullptr, y.data_ptr<scalar_t>(),
                      final_state.data_ptr<scalar_t>(), checkpoints.data_ptr<scalar_t>());
    });
  });
  return {y, final_state, checkpoints};
}

// Returns dx, ddt, dA, dB, dC and d(initial_state) (empty when with_initial is false).
std::vector<torch::Tensor> scan_backward(torch::Tensor x, torch::Tensor dt, torch::Tensor A, torch::Tensor B,
                                         torch::Tensor C, c10::optional<torch::Tensor> seq_idx,
                                         torch::Tensor checkpoints, torch::Tensor dy,
                                         c10::optional<torch::Tensor> dfinal, bool with_initial, int64_t span) {
  const Dims d = dims_of(x, B, span);
  check(dy, x, {d.batch, d.len, d.heads, d.headdim}, "dy");
  check(checkpoints, x, {d.batch, d.heads, d.spans(), d.headdim, d.d_state}, "checkpoints");
  if (dfinal) check(*dfinal, x, {d.batch, d.heads, d.headdim, d.d_state}, "dfinal");
  auto dx = torch::empty_like(x), ddt = torch::empty_like(dt);
  auto dA = torch::empty({d.batch, d.heads}, x.options());
  auto dB = torch::zeros_like(B), dC = torch::zeros_like(C);
  auto dinit = with_initial ? torch::empty({d.batch, d.heads, d.headdim, d.d_state}, x.options()) : torch::empty({0}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scan_backward", [&] {
    with_sizes(d.d_state, d.headdim, [&](auto NS, auto PS) {
    backward<scalar_t, decltype(NS)::value, 0>(  // (headdim at run time: see with_sizes)
d, x.data_ptr<scalar_t>(), dt.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
                       B.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(), seq_ptr(seq_idx, d),
                       checkpoints.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                       dfinal ? dfinal->data_ptr<scalar_t>() : nullptr, dx.data_ptr<scalar_t>(),
                       ddt.data_ptr<scalar_t>(), dA.data_ptr<scalar_t>(), dB.data_ptr<scalar_t>(),
                       dC.data_ptr<scalar_t>(), with_initial ? dinit.data_ptr<scalar_t>() : nullptr);
    });
  });
  return {dx, ddt, dA.sum(0), dB, dC, dinit};
}

ConvDims conv_dims(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias,
                   const c10::optional<torch::Tensor>& seq) {
  TORCH_CHECK(x.dim() == 3 && x.device().is_cpu() && x.is_contiguous(), "x must be a contiguous CPU (b, l, c)");
  ConvDims d{x.size(0), x.size(1), x.size(2), w.size(-1)};
  check(w, x, {d.channels, 1, d.k}, "conv weight");
  if (bias) check(*bias, x, {d.channels}, "conv bias");
  if (seq)
    TORCH_CHECK(seq->scalar_type() == torch::kLong && seq->is_contiguous() &&
                    seq->sizes() == at::IntArrayRef({d.batch, d.len}),
                "seq_idx must be contiguous int64 (b, l)");
  return d;
}

torch::Tensor conv_silu_forward(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                                c10::optional<torch::Tensor> seq_idx) {
  const ConvDims d = conv_dims(x, w, bias, seq_idx);
  auto y = torch::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_silu_forward", [&] {
    conv_forward<scalar_t>(d, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                           bias ? bias->data_ptr<scalar_t>() : nullptr,
                           seq_idx ? seq_idx->data_ptr<int64_t>() : nullptr, y.data_ptr<scalar_t>());
  });
  return y;
}

// Returns dx, dw and dbias (empty without a bias).
std::vector<torch::Tensor> conv_silu_backward(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                                              c10::optional<torch::Tensor> seq_idx, torch::Tensor dy) {
  const ConvDims d = conv_dims(x, w, bias, seq_idx);
  check(dy, x, {d.batch, d.len, d.channels}, "dy");
  auto dx = torch::empty_like(x), dw = torch::empty_like(w), dbias = torch::empty({d.channels}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_silu_backward", [&] {
    conv_backward<scalar_t>(d, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                            bias ? bias->data_ptr<scalar_t>() : nullptr,
                            seq_idx ? seq_idx->data_ptr<int64_t>() : nullptr, dy.data_ptr<scalar_t>(),
                            dx.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>(), dbias.data_ptr<scalar_t>());
  });
  return {dx, dw, bias ? dbias : torch::empty({0}, x.options())};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scan_forward", &scan_forward, "Mamba-2 SSM scan, token by token, with checkpoints");
  m.def("scan_backward", &scan_backward, "its gradients, the recurrence in reverse");
  m.def("conv_silu_forward", &conv_silu_forward, "causal depthwise conv, then SiLU");
  m.def("conv_silu_backward", &conv_silu_backward, "its gradients");
}
