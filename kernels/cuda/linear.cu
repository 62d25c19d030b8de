// linear forward and backward on the device (kernels/cuda/cuda_ops.hpp): the GEMMs through
// cuBLASLt with f32 accumulation (CUBLAS_COMPUTE_32F) on f32, bf16 or f16 operands, the bias fused
// into the forward GEMM's epilogue when it has the output's type, the bias gradient a fixed-order
// column sum (no atomics).
//
// Row-major tensors are column-major transposes, so with out = x W^T (x (N,I), W (O,I), out (N,O)):
//   forward   out^T (O x N) = op_T(W stored I x O) . x^T (I x N)          m=O n=N k=I
//   dx        dx^T  (I x N) = W^T (stored I x O) . dout^T (O x N)          m=I n=N k=O
//   dW       dW^T  (I x O) += x^T (I x N) . op_T(dout^T stored O x N)      m=I n=O k=N, beta 1
#include <cublasLt.h>

#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace troupe::cuda {

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    const std::string m = std::string("cuBLASLt ") + what + ": " + cublasGetStatusString(s);
    TROUPE_CHECK(false, m.c_str());
  }
}

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  TROUPE_CHECK(false, "linear: the CUDA backend's GEMMs take f32, bf16 or f16");
  return CUDA_R_32F;
}

struct Operand {
  const void* data;
  DType dtype;
  bool transposed;       // op(X) = X^T
  uint64_t rows, cols;   // of the stored column-major matrix
  int64_t ld;
};

// D (m x n, column-major, leading dimension ldd, type dtype) = op(A) op(B) + beta D (+ bias per row).
void lt_matmul(const Context& ctx, const Operand& a, const Operand& b, void* d, DType dtype, uint64_t m, uint64_t n,
               int64_t ldd, float beta, const void* bias) {
  auto handle = static_cast<cublasLtHandle_t>(ctx.blas_handle);
  TROUPE_CHECK(handle != nullptr, "linear: the CUDA Context has no cuBLASLt handle (cuda::DeviceContext makes one)");
  cublasLtMatmulDesc_t op = nullptr;
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t ta = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, tb = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
  if (bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "epilogue");
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "bias");
  }
  cublasLtMatrixLayout_t al = nullptr, bl = nullptr, dl = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&al, lt_type(a.dtype), a.rows, a.cols, a.ld), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&bl, lt_type(b.dtype), b.rows, b.cols, b.ld), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&dl, lt_type(dtype), m, n, ldd), "layout D");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const size_t ws = ctx.blas_workspace_bytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "workspace size");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(handle, op, al, bl, dl, dl, pref, 1, &result, &found), "heuristic");
  TROUPE_CHECK(found > 0, "linear: cuBLASLt has no algorithm for this GEMM's types and shape");
  const float alpha = 1.0f;
  check_lt(cublasLtMatmul(handle, op, &alpha, a.data, al, b.data, bl, &beta, d, dl, d, dl, &result.algo,
                          ctx.blas_workspace, ws, stream_of(ctx)),
           "matmul");
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(dl);
  cublasLtMatrixLayoutDestroy(bl);
  cublasLtMatrixLayoutDestroy(al);
  cublasLtMatmulDescDestroy(op);
}

// out[n, o] += bias[o] (a bias of another type than out's, which the epilogue does not take).
template <class TO, class TB>
__global__ void add_bias_kernel(TO* out, const TB* bias, int64_t N, int64_t O) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * O; i += int64_t{gridDim.x} * blockDim.x)
    st(out, i, ld(out, i) + ld(bias, i % O));
}

// dbias[o] += sum_n dout[n, o]: one thread per column, rows in order.
template <class TD, class TB>
__global__ void bias_grad_kernel(TB* dbias, const TD* dout, int64_t N, int64_t O) {
  const int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (o >= O) return;
  float s = 0;
  for (int64_t n = 0; n < N; ++n) s += ld(dout, n * O + o);
  st(dbias, o, ld(dbias, o) + s);
}

}  // namespace

void linear_forward(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_device(ctx, {&out, &x, &weight, &bias}, "linear: device tensors on a CUDA context");
  const int64_t O = weight.dim(0), I = weight.dim(1), N = x.numel() / I;
  TROUPE_CHECK(x.dim(-1) == I && out.dim(-1) == O && out.numel() == N * O, "linear: x (N,I), weight (O,I), out (N,O)");
  TROUPE_CHECK(!bias.defined() || bias.numel() == O, "linear: bias is (O)");
  TROUPE_CHECK(x.dtype() == weight.dtype(), "linear: x and the weight share a dtype on the CUDA backend");
  const bool fused_bias = bias.defined() && bias.dtype() == out.dtype();
  lt_matmul(ctx, Operand{weight.raw(), weight.dtype(), true, uint64_t(I), uint64_t(O), I},
            Operand{x.raw(), x.dtype(), false, uint64_t(I), uint64_t(N), I}, out.raw(), out.dtype(), uint64_t(O),
            uint64_t(N), O, 0.0f, fused_bias ? bias.raw() : nullptr);
  if (bias.defined() && !fused_bias) {
    with_type(out.dtype(), "linear", [&](auto o) {
      using TO = decltype(o);
      with_type(bias.dtype(), "linear", [&](auto b) {
        using TB = decltype(b);
        add_bias_kernel<TO, TB><<<blocks_for(N * O), kThreads, 0, stream_of(ctx)>>>(dptr<TO>(out), dptr<TB>(bias), N, O);
      });
    });
    TROUPE_CUDA_LAUNCHED("linear bias");
  }
}

void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& x, const Tensor& weight) {
  check_device(ctx, {&dx, &dweight, &dbias, &dout, &x, &weight}, "linear backward: device tensors on a CUDA context");
  const int64_t O = dout.dim(-1), N = dout.numel() / O;
  TROUPE_CHECK(!dx.defined() || (weight.defined() && weight.dim(0) == O && dx.numel() == N * weight.dim(1)),
               "linear backward: dx (N,I) needs the weight (O,I)");
  TROUPE_CHECK(!dweight.defined() || (x.defined() && dweight.dim(0) == O && x.numel() == N * dweight.dim(1)),
               "linear backward: dweight (O,I) needs x (N,I)");
  TROUPE_CHECK(!dbias.defined() || dbias.numel() == O, "linear backward: dbias is (O)");
  if (dx.defined()) {
    const int64_t I = weight.dim(1);
    TROUPE_CHECK(weight.dtype() == dout.dtype(), "linear backward: dout and the weight share a dtype");
    lt_matmul(ctx, Operand{weight.raw(), weight.dtype(), false, uint64_t(I), uint64_t(O), I},
              Operand{dout.raw(), dout.dtype(), false, uint64_t(O), uint64_t(N), O}, dx.raw(), dx.dtype(),
              uint64_t(I), uint64_t(N), I, 0.0f, nullptr);
  }
  if (dweight.defined()) {
    const int64_t I = x.numel() / N;
    TROUPE_CHECK(x.dtype() == dout.dtype(), "linear backward: dout and x share a dtype");
    lt_matmul(ctx, Operand{x.raw(), x.dtype(), false, uint64_t(I), uint64_t(N), I},
              Operand{dout.raw(), dout.dtype(), true, uint64_t(O), uint64_t(N), O}, dweight.raw(), dweight.dtype(),
              uint64_t(I), uint64_t(O), I, 1.0f, nullptr);
  }
  if (dbias.defined()) {
    with_type(dout.dtype(), "linear backward", [&](auto d) {
      using TD = decltype(d);
      with_type(dbias.dtype(), "linear backward", [&](auto b) {
        using TB = decltype(b);
        bias_grad_kernel<TD, TB><<<blocks_for(O), kThreads, 0, stream_of(ctx)>>>(dptr<TB>(dbias), dptr<TD>(dout), N, O);
      });
    });
    TROUPE_CUDA_LAUNCHED("linear bias gradient");
  }
}

}  // namespace troupe::cuda
