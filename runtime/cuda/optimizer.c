/* optimizer.c — the optimizer on the GPUs: the sum of squares of a gradient (the global norm)
 * and AdamW on a parameter slice in place, as runtime/train.c does on the host. */
#include "cuda_internal.h"

/* ---- the optimizer's kernels (ntp_cuda_sumsq, ntp_cuda_adamw): AdamW on a parameter slice in
 * place, as train.c does on the host, and the sum of squares of a gradient over the elements a
 * mask marks (the global norm counts each element once, on its first holder) ---- */
static const char opt_src[] =
    RUNTIME_KERNEL_PRELUDE
    "extern \"C\" __global__ void __launch_bounds__(256) ntp_sumsq(const unsigned char *g, int dt, const unsigned char *mask, i64 n, float *partial) {\n"
    "  __shared__ float sh[256];\n"
    "  float s = 0.0f;\n"
    "  for (i64 i = (i64)blockIdx.x * 256 + threadIdx.x; i < n; i += (i64)gridDim.x * 256)\n"
    "    if (mask[i]) { float x = ldv(g, dt, i); s += x * x; }\n"
    "  sh[threadIdx.x] = s;\n"
    "  __syncthreads();\n"
    "  for (int w = 128; w > 0; w >>= 1) { if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w]; __syncthreads(); }\n"
    "  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];\n"
    "}\n"
    "struct adamw_h { float lr, b1, b2, c1, c2, eps, wd, scale; };\n"
    "extern \"C\" __global__ void __launch_bounds__(256) ntp_adamw(unsigned char *p, int dt, const unsigned char *g, int gdt, float *w, float *m, float *v, i64 n, adamw_h h) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= n) return;\n"
    "  float ge = g ? ldv(g, gdt, i) * h.scale : 0.0f;\n"
    "  float mm = h.b1 * m[i] + (1.0f - h.b1) * ge, vv = h.b2 * v[i] + (1.0f - h.b2) * ge * ge;\n"
    "  m[i] = mm; v[i] = vv;\n"
    "  float x = w[i];\n"
    "  x -= h.lr * ((mm / h.c1) / (sqrtf(vv / h.c2) + h.eps) + h.wd * x);\n"
    "  w[i] = x;\n"
    "  stv(p, dt, i, x);\n"
    "}\n";
enum { OPT_PARTIALS = 1024 }; /* blocks of ntp_sumsq */

/* ---- the optimizer on the GPUs ------------------------------------------------------------- */

static int opt_ready(ntp_cuda *c, char *err, size_t cap) {
  if (c->opt_lib) return 0;
  c->partials = calloc((size_t)c->p->world, sizeof *c->partials);
  if (!c->partials) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++)
    if (ntp_cuda_alloc(c, r, OPT_PARTIALS * sizeof(float), (void **)&c->partials[r], err, cap) != 0) return -1;
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  if (cu_load_library(opt_src, "ntp_optimizer.cu", c->arch, &c->opt_lib, err, cap) != 0) return -1;
  CU(cu_api.cudaLibraryGetKernel(&c->k_sumsq, c->opt_lib, "ntp_sumsq"));
  CU(cu_api.cudaLibraryGetKernel(&c->k_adamw, c->opt_lib, "ntp_adamw"));
  return 0;
fail:
  return -1;
}

int ntp_cuda_sumsq(ntp_cuda *c, int32_t t, const unsigned char *mask, double *out, char *err, size_t cap) {
  *out = 0;
  if (opt_ready(c, err, cap) != 0) return -1;
  const ntp_tensor *s = &c->p->tensors[t];
  int r = s->rank, dt = (int)s->dtype;
  long long n = (long long)box_volume(&s->box);
  if (n == 0) return 0;
  int blocks = (int)((n + 255) / 256 < OPT_PARTIALS ? (n + 255) / 256 : OPT_PARTIALS);
  const unsigned char *g = dev_ptr(c, t);
  float *part = c->partials[r], host[OPT_PARTIALS];
  void *args[] = {&g, &dt, &mask, &n, &part};
  CU(cu_api.cudaSetDevice(c->dev[r]));
  CU(cu_api.cudaLaunchKernel((const void *)c->k_sumsq, (dim3){(unsigned)blocks, 1, 1}, (dim3){256, 1, 1}, args, 0,
                         c->stream[r]));
  if (ntp_cuda_get(c, r, host, part, (size_t)blocks * sizeof(float), err, cap) != 0) return -1;
  for (int b = 0; b < blocks; b++) *out += host[b];
  return 0;
fail:
  return -1;
}

int ntp_cuda_adamw(ntp_cuda *c, int32_t param, int32_t grad, float *master, float *m, float *v,
                   const ntp_cuda_adamw_args *h, char *err, size_t cap) {
  if (opt_ready(c, err, cap) != 0) return -1;
  const ntp_tensor *s = &c->p->tensors[param];
  int r = s->rank, dt = (int)s->dtype, gdt = grad >= 0 ? (int)c->p->tensors[grad].dtype : 2;
  long long n = (long long)box_volume(&s->box);
  unsigned char *pp = dev_ptr(c, param);
  const unsigned char *gp = grad >= 0 ? dev_ptr(c, grad) : NULL;
  struct { float lr, b1, b2, c1, c2, eps, wd, scale; } hh = {h->lr, h->beta1, h->beta2, h->c1, h->c2, h->eps, h->wd, h->scale};
  void *args[] = {&pp, &dt, &gp, &gdt, &master, &m, &v, &n, &hh};
  CU(cu_api.cudaSetDevice(c->dev[r]));
  return cu_launch(c->k_adamw, n, args, c->stream[r], err, cap);
fail:
  return -1;
}
