// The Mamba-2 single-token step on a CPU, in place by cache slot (looplab/models/cpu/cpu_step.py).
//
// For each row b, with s = slots[b] (or b): the causal conv reads the slot's last
// d_conv - 1 inputs and the new one, then the slot's conv state shifts by one; the
// SSM state of the slot advances S <- exp(dt A) S + dt x B^T and y = S C + D x; the
// output is the gated RMSNorm of y (RMSNorm(y * silu(z)) * weight per group). The
// arithmetic is Mamba2._step_torch's; only the order of some sums differs (the conv
// adds its bias first, the SSM's y = S C sums in vector lanes), so float64 agrees to
// rounding. What changes is that no state is gathered or scattered and the ~25
// tensor operations per block become one call. No fast-math: exactness tests run in
// float64, and its vector exp is not worth a process-wide change of float semantics.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename T>
T silu(T v) { return v / (T(1) + std::exp(-v)); }

template <typename T>
T softplus(T v) { return v > T(20) ? v : std::log1p(std::exp(v)); }  // torch's threshold 20

struct Dims {
  int64_t n, conv_dim, k, heads, headdim, groups, d_state;
  int64_t xbc_stride, dt_stride, z_stride;
};

template <typename T>
void step_rows(const Dims& d, const T* xbc, const T* dt_in, const T* z, T* conv, T* ssm, const int64_t* slots,
               const T* conv_w, const T* conv_b, const T* dt_bias, const T* A, const T* D, const T* norm_w,
               double eps, T* out) {
  const int64_t d_inner = d.heads * d.headdim, heads_per_group = d.heads / d.groups;
  const int64_t group_size = d_inner / d.groups, taps = d.k - 1;
  // Rows are independent; split them across threads only when a row is real work.
  const int64_t grain = std::max<int64_t>(1, 32768 / (d_inner * d.d_state + d.conv_dim * d.k));
  at::parallel_for(0, d.n, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> act(d.conv_dim), y(d_inner);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t s = slots ? slots[b] : b;
      T* cs = conv + s * taps * d.conv_dim;  // (d_conv - 1, conv_dim), oldest first
      const T* x_new = xbc + b * d.xbc_stride;
      // Channels are contiguous in the time-major conv state: each tap is one vector pass.
      T* a = act.data();
      for (int64_t c = 0; c < d.conv_dim; ++c) a[c] = conv_b ? conv_b[c] : T(0);
      for (int64_t t = 0; t < d.k; ++t) {
        const T* in = t < taps ? cs + t * d.conv_dim : x_new;
#pragma omp simd
        for (int64_t c = 0; c < d.conv_dim; ++c) a[c] += in[c] * conv_w[c * d.k + t];
      }
      // The state shifts by one input: taps 1.. move down, the new input goes last.
      if (taps) {
        std::copy(cs + d.conv_dim, cs + taps * d.conv_dim, cs);
        std::copy(x_new, x_new + d.conv_dim, cs + (taps - 1) * d.conv_dim);
      }
      for (int64_t c = 0; c < d.conv_dim; ++c) a[c] = silu(a[c]);
      const T* x = act.data();  // [x | B | C]
      const T* B = x + d_inner;
      const T* C = B + d.groups * d.d_state;
      for (int64_t h = 0; h < d.heads; ++h) {
        const int64_t g = h / heads_per_group;
        const T dt = softplus(dt_in[b * d.dt_stride + h] + dt_bias[h]);
        const T decay = std::exp(dt * A[h]);
        const T* Bg = B + g * d.d_state;
        const T* Cg = C + g * d.d_state;
        for (int64_t p = 0; p < d.headdim; ++p) {
          T* row = ssm + ((s * d.heads + h) * d.headdim + p) * d.d_state;
          const T xv = x[h * d.headdim + p];
          const T xdt = dt * xv;
          T acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t m = 0; m < d.d_state; ++m) {
            const T v = row[m] * decay + xdt * Bg[m];
            row[m] = v;
            acc += v * Cg[m];
          }
          y[h * d.headdim + p] = acc + xv * D[h];
        }
      }
      const T* zb = z + b * d.z_stride;
      for (int64_t g = 0; g < d.groups; ++g) {
        const int64_t lo = g * group_size, hi = lo + group_size;
        T squares = 0;
        for (int64_t i = lo; i < hi; ++i) {
          y[i] *= silu(zb[i]);
          squares += y[i] * y[i];
        }
        const T scale = T(1) / std::sqrt(squares / T(group_size) + T(eps));
        for (int64_t i = lo; i < hi; ++i) out[b * d_inner + i] = y[i] * scale * norm_w[i];
      }
    }
  });
}

void check_vector(const torch::Tensor& t, const torch::Tensor& like, int64_t size, const char* name) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == size && t.is_contiguous() && t.scalar_type() == like.scalar_type(),
              name, " must be a contiguous vector of ", size, " ", like.scalar_type());
}

}  // namespace

// xbc (n, conv_dim), dt (n, heads), z (n, d_inner): rows of in_proj's output (unit
// stride along the row). conv (slots, d_conv - 1, conv_dim) and ssm (slots, heads,
// headdim, d_state): contiguous, updated in place. Returns the normed y (n, d_inner).
torch::Tensor mamba2_step(torch::Tensor xbc, torch::Tensor dt, torch::Tensor z, torch::Tensor conv, torch::Tensor ssm,
                          c10::optional<torch::Tensor> slots, torch::Tensor conv_w, c10::optional<torch::Tensor> conv_b,
                          torch::Tensor dt_bias, torch::Tensor A, torch::Tensor D, torch::Tensor norm_w, double eps,
                          int64_t groups) {
  TORCH_CHECK(xbc.device().is_cpu(), "mamba2_step runs on the CPU");
  TORCH_CHECK(ssm.dim() == 4 && conv.dim() == 3 && conv.is_contiguous() && ssm.is_contiguous(),
              "conv and ssm states must be contiguous (slots, d_conv - 1, conv_dim), (slots, heads, headdim, d_state)");
  const auto dtype = xbc.scalar_type();
  for (const auto* t : {&dt, &z, &conv, &ssm, &conv_w}) TORCH_CHECK(t->scalar_type() == dtype, "mixed dtypes");
  Dims d{xbc.size(0), xbc.size(1), conv_w.size(-1), ssm.size(1), ssm.size(2), groups, ssm.size(3),
         xbc.stride(0), dt.stride(0), z.stride(0)};
  const int64_t d_inner = d.heads * d.headdim;
  TORCH_CHECK(xbc.stride(1) == 1 && dt.stride(1) == 1 && z.stride(1) == 1, "rows must have unit stride");
  TORCH_CHECK(d.conv_dim == d_inner + 2 * groups * d.d_state && conv.size(2) == d.conv_dim && conv.size(1) == d.k - 1,
              "xbc, conv state and conv weight disagree on conv_dim or d_conv");
  TORCH_CHECK(dt.size(0) == d.n && z.size(0) == d.n && dt.size(1) == d.heads && z.size(1) == d_inner,
              "dt (n, heads) and z (n, d_inner) must match xbc's rows");
  TORCH_CHECK(d.heads % groups == 0 && conv_w.is_contiguous() && conv_w.numel() == d.conv_dim * d.k,
              "heads must split into groups; conv weight (conv_dim, 1, d_conv) contiguous");
  check_vector(dt_bias, xbc, d.heads, "dt_bias");
  check_vector(A, xbc, d.heads, "A");
  check_vector(D, xbc, d.heads, "D");
  check_vector(norm_w, xbc, d_inner, "norm weight");
  if (conv_b) check_vector(*conv_b, xbc, d.conv_dim, "conv bias");
  const int64_t n_slots = ssm.size(0);
  TORCH_CHECK(conv.size(0) == n_slots, "conv and ssm states must have the same slots");
  if (slots) {
    TORCH_CHECK(slots->scalar_type() == torch::kLong && slots->is_contiguous() && slots->numel() == d.n,
                "slots must be n contiguous int64 indices");
    const int64_t* sp = slots->data_ptr<int64_t>();
    for (int64_t i = 0; i < d.n; ++i) TORCH_CHECK(0 <= sp[i] && sp[i] < n_slots, "slot ", sp[i], " out of range");
  } else {
    TORCH_CHECK(d.n == n_slots, "without slots, rows and state slots must match");
  }
  auto out = torch::empty({d.n, d_inner}, xbc.options());
  AT_DISPATCH_FLOATING_TYPES(dtype, "mamba2_step", [&] {
    step_rows<scalar_t>(d, xbc.data_ptr<scalar_t>(), dt.data_ptr<scalar_t>(), z.data_ptr<scalar_t>(),
                        conv.data_ptr<scalar_t>(), ssm.data_ptr<scalar_t>(),
                        slots ? slots->data_ptr<int64_t>() : nullptr, conv_w.data_ptr<scalar_t>(),
                        conv_b ? conv_b->data_ptr<scalar_t>() : nullptr, dt_bias.data_ptr<scalar_t>(),
                        A.data_ptr<scalar_t>(), D.data_ptr<scalar_t>(), norm_w.data_ptr<scalar_t>(), eps,
                        out.data_ptr<scalar_t>());
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mamba2_step", &mamba2_step, "Mamba-2 single-token step, in place by slot");
}
