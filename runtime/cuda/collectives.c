/* collectives.c — the collective steps: loopback (every rank on one GPU: three small kernels that
 * copy and reduce boxes, in the CPU simulation's order) and NCCL (all-reduce where the step is one,
 * grouped sends and receives otherwise). */
#include "cuda_internal.h"

/* ---- collectives on one GPU: three kernels over boxes ----------------------------------- */

const char cu_comm_src[] =
    RUNTIME_KERNEL_PRELUDE
    "struct box_geom { i64 n; int nd, esize; i64 len[6], sstr[6], dstr[6], soff, doff; };\n"
    "__device__ void offsets(const box_geom &g, i64 i, i64 *so, i64 *dd) {\n"
    "  i64 s = g.soff, d = g.doff;\n"
    "  for (int k = g.nd - 1; k >= 0; k--) { i64 c = i % g.len[k]; i /= g.len[k]; s += c * g.sstr[k]; d += c * g.dstr[k]; }\n"
    "  *so = s; *dd = d;\n"
    "}\n"
    "extern \"C\" __global__ void ntp_copy_box(const unsigned char *src, unsigned char *dst, box_geom g) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= g.n) return;\n"
    "  i64 s, d; offsets(g, i, &s, &d);\n"
    "  if (g.esize == 2) ((u16 *)dst)[d] = ((const u16 *)src)[s]; else ((u32 *)dst)[d] = ((const u32 *)src)[s];\n"
    "}\n"
    "extern \"C\" __global__ void ntp_acc_box(const unsigned char *src, float *acc, int dt, box_geom g) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= g.n) return;\n"
    "  i64 s, d; offsets(g, i, &s, &d);\n"
    "  acc[d] += ldv(src, dt, s);\n"
    "}\n"
    "extern \"C\" __global__ void ntp_store_acc(const float *acc, unsigned char *dst, int dt, i64 n) {\n"
    "  i64 i = (i64)blockIdx.x * 256 + threadIdx.x; if (i >= n) return;\n"
    "  stv(dst, dt, i, acc[i]);\n"
    "}\n";

static box_geom geometry(const ntp_box *x, const ntp_box *src, const ntp_box *dst, int esize) {
  box_geom g = {.nd = x->ndim, .esize = esize, .n = box_volume(x)};
  int64_t ss = 1, ds = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    g.len[d] = x->hi[d] - x->lo[d];
    g.sstr[d] = ss;
    g.dstr[d] = ds;
    g.soff += (x->lo[d] - src->lo[d]) * ss;
    g.doff += (x->lo[d] - dst->lo[d]) * ds;
    ss *= src->hi[d] - src->lo[d];
    ds *= dst->hi[d] - dst->lo[d];
  }
  if (x->ndim == 0) {
    g.nd = 1;
    g.len[0] = 1;
  }
  return g;
}

int cu_launch(cudaKernel_t k, int64_t n, void **args, cudaStream_t stream, char *err, size_t cap) {
  if (n <= 0) return 0;
  CU(cu_api.cudaLaunchKernel((const void *)k, (dim3){(unsigned)((n + 255) / 256), 1, 1}, (dim3){256, 1, 1}, args, 0, stream));
  return 0;
fail:
  return -1;
}

/* copy box x of tensor src (at sp) into tensor dst (at dp), on the given stream */
int cu_copy_box(ntp_cuda *c, const ntp_box *x, const ntp_box *sbox, unsigned char *sp, const ntp_box *dbox,
                unsigned char *dp, ntp_dtype dt, cudaStream_t stream, char *err, size_t cap) {
  box_geom g = geometry(x, sbox, dbox, (int)dtype_bytes(dt));
  void *args[] = {&sp, &dp, &g};
  return cu_launch(c->k_copy, g.n, args, stream, err, cap);
}

/* Loopback: every rank on one GPU; copies and fp32 reductions as kernels. */
int cu_run_comm_loopback(ntp_cuda *c, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  cudaStream_t stream = c->comm[0];
  if (st->comm != COMM_ALL_REDUCE && st->comm != COMM_REDUCE_SCATTER) {
    for (size_t i = 0; i < st->nxfers; i++) {
      const ntp_xfer *x = &st->xfers[i];
      const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
      if (cu_copy_box(c, &x->box, &s->box, dev_ptr(c, x->src), &d->box, dev_ptr(c, x->dst), s->dtype, stream, err, cap))
        return -1;
    }
    return 0;
  }
  for (size_t i = 0; i < st->nxfers; i++) {
    int32_t dst = st->xfers[i].dst;
    bool first = true;
    for (size_t j = 0; j < i; j++) first &= st->xfers[j].dst != dst;
    if (!first) continue;
    const ntp_tensor *d = &p->tensors[dst];
    int64_t n = box_volume(&d->box);
    CU(cu_api.cudaMemsetAsync(c->scratch, 0, (size_t)n * sizeof(float), stream));
    int dt = (int)d->dtype;
    for (size_t j = i; j < st->nxfers; j++) {
      if (st->xfers[j].dst != dst) continue;
      const ntp_tensor *s = &p->tensors[st->xfers[j].src];
      box_geom g = geometry(&st->xfers[j].box, &s->box, &d->box, 4);
      unsigned char *sp = dev_ptr(c, st->xfers[j].src);
      void *args[] = {&sp, &c->scratch, &dt, &g};
      if (cu_launch(c->k_acc, g.n, args, stream, err, cap)) return -1;
    }
    unsigned char *dp = dev_ptr(c, dst);
    void *args[] = {&c->scratch, &dp, &dt, &n};
    if (cu_launch(c->k_store, n, args, stream, err, cap)) return -1;
  }
  return 0;
fail:
  return -1;
}

static ncclDataType_t nccl_type(ntp_dtype dt) {
  return dt == NTP_BF16 ? ncclBfloat16 : dt == NTP_FP16 ? ncclFloat16 : dt == NTP_FP32 ? ncclFloat32 : ncclInt32;
}

/* Is a reduction step what ncclAllReduce computes: every member adds its whole part (one source
 * per member, all of the same box), and each destination, inside that box, receives exactly one
 * box from every member? The forward's reductions are; the backward's adjoints (gradients of
 * gathered or redistributed pieces summed back at their sources, a parameter's gradient summed
 * over the cells of replicas that split it differently) in general are not. */
bool cu_symmetric_reduction(const ntp_program *p, const ntp_step *st) {
  if (st->nxfers == 0) return true;
  const ntp_box *whole = &p->tensors[st->xfers[0].src].box;
  int own = 0;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (!box_eq(&s->box, whole) || !box_eq(&x->box, &d->box) || !box_contains(whole, &d->box)) return false;
    int from = 0;
    for (size_t j = 0; j < st->nxfers; j++) {
      if (st->xfers[j].dst != x->dst) continue;
      from++;
      for (size_t k = 0; k < j; k++) /* two boxes from one rank into one destination */
        if (st->xfers[k].dst == x->dst && p->tensors[st->xfers[k].src].rank == p->tensors[st->xfers[j].src].rank)
          return false;
    }
    if (from != st->nranks) return false;
    if (s->rank == d->rank) own++;
    for (size_t j = 0; j < i; j++) /* one source tensor per rank */
      if (p->tensors[st->xfers[j].src].rank == s->rank && st->xfers[j].src != x->src) return false;
  }
  return own == st->nranks;
}

/* Every transfer between two ranks of a step: its box packed into the sender's staging (from
 * used[sender] on: at[i]) and sent; received into the receiver's staging (from used[receiver]
 * on: recv_at[i]), in one group of NCCL calls. Transfers within a rank are the caller's. */
static int exchange_remote(ntp_cuda *c, const ntp_step *st, size_t *used, size_t *at, size_t *recv_at, char *err,
                           size_t cap) {
  const ntp_program *p = c->p;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank == d->rank || !local_rank(c, s->rank)) continue;
    int r = s->rank;
    at[i] = used[r];
    used[r] += ((size_t)box_volume(&x->box) * dtype_bytes(s->dtype) + 255) / 256 * 256;
    CU(cu_api.cudaSetDevice(c->dev[r])); /* pack into the sender's staging */
    ntp_box packed = x->box;
    if (cu_copy_box(c, &x->box, &s->box, dev_ptr(c, x->src), &packed, c->staging[r] + at[i], s->dtype, c->comm[r], err,
                 cap))
      return -1;
  }
  NC(cu_api.ncclGroupStart());
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank == d->rank) continue;
    size_t n = (size_t)box_volume(&x->box);
    if (local_rank(c, s->rank)) {
      CU(cu_api.cudaSetDevice(c->dev[s->rank]));
      NC(cu_api.ncclSend(c->staging[s->rank] + at[i], n, nccl_type(s->dtype), d->rank, c->world[s->rank], c->comm[s->rank]));
    }
    if (local_rank(c, d->rank)) {
      int r = d->rank;
      recv_at[i] = used[r];
      used[r] += (n * dtype_bytes(s->dtype) + 255) / 256 * 256;
      CU(cu_api.cudaSetDevice(c->dev[r]));
      NC(cu_api.ncclRecv(c->staging[r] + recv_at[i], n, nccl_type(s->dtype), s->rank, c->world[r], c->comm[r]));
    }
  }
  NC(cu_api.ncclGroupEnd());
  return 0;
fail:
  return -1;
}

/* A reduction that is not symmetric_reduction's, on separate GPUs: every remote box is sent
 * packed to its destination's rank; each destination is then the sum, in the step's order of
 * transfers, of its boxes, in an fp32 accumulator at the start of the rank's staging — the
 * loopback's arithmetic in the loopback's order, so both modes give the same bits. */
static int reduce_by_exchange(ntp_cuda *c, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  size_t *used = calloc((size_t)p->world, sizeof *used), *at = calloc(st->nxfers + 1, sizeof *at);
  size_t *recv_at = calloc(st->nxfers + 1, sizeof *recv_at);
  if (!used || !at || !recv_at) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) { /* the accumulators: the largest destination of each rank */
    const ntp_tensor *d = &p->tensors[st->xfers[i].dst];
    size_t b = ((size_t)box_volume(&d->box) * sizeof(float) + 255) / 256 * 256;
    if (b > used[d->rank]) used[d->rank] = b;
  }
  if (exchange_remote(c, st, used, at, recv_at, err, cap) != 0) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) {
    int32_t dst = st->xfers[i].dst;
    const ntp_tensor *d = &p->tensors[dst];
    bool first = true;
    for (size_t j = 0; j < i; j++) first &= st->xfers[j].dst != dst;
    if (!first || !local_rank(c, d->rank)) continue;
    int r = d->rank, dt = (int)d->dtype;
    int64_t n = box_volume(&d->box);
    float *acc = (float *)c->staging[r];
    CU(cu_api.cudaSetDevice(c->dev[r]));
    CU(cu_api.cudaMemsetAsync(acc, 0, (size_t)n * sizeof(float), c->comm[r]));
    for (size_t j = i; j < st->nxfers; j++) {
      const ntp_xfer *x = &st->xfers[j];
      if (x->dst != dst) continue;
      const ntp_tensor *s = &p->tensors[x->src];
      bool remote = s->rank != r;
      box_geom g = geometry(&x->box, remote ? &x->box : &s->box, &d->box, 4);
      unsigned char *sp = remote ? c->staging[r] + recv_at[j] : dev_ptr(c, x->src);
      void *args[] = {&sp, &acc, &dt, &g};
      if (cu_launch(c->k_acc, g.n, args, c->comm[r], err, cap)) goto fail;
    }
    unsigned char *dp = dev_ptr(c, dst);
    void *args[] = {&acc, &dp, &dt, &n};
    if (cu_launch(c->k_store, n, args, c->comm[r], err, cap)) goto fail;
  }
  free(used);
  free(at);
  free(recv_at);
  return 0;
fail:
  free(used);
  free(at);
  free(recv_at);
  if (!err[0]) snprintf(err, cap, "out of memory");
  return -1;
}

/* Separate GPUs: reductions are NCCL all-reduces in the group's communicator (an uneven
 * reduce-scatter reduces into staging and keeps its slice), or reduce_by_exchange's sums;
 * moves are grouped send/recv of packed boxes on the world communicator. */
int cu_run_comm_nccl(ntp_cuda *c, int32_t si, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  size_t *used = NULL, *at = NULL, *recv_at = NULL;
  if ((st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) && c->step_set[si] < 0)
    return reduce_by_exchange(c, st, err, cap);
  if (st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) {
    int set = c->step_set[si];
    NC(cu_api.ncclGroupStart());
    for (size_t i = 0; i < st->nxfers; i++) {
      const ntp_xfer *x = &st->xfers[i];
      const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
      if (s->rank != d->rank || !local_rank(c, s->rank)) continue; /* one call per member: its own part */
      int r = s->rank;
      bool whole = box_eq(&d->box, &s->box);
      CU(cu_api.cudaSetDevice(c->dev[r]));
      NC(cu_api.ncclAllReduce(dev_ptr(c, x->src), whole ? dev_ptr(c, x->dst) : c->staging[r], (size_t)box_volume(&s->box),
                          nccl_type(s->dtype), ncclSum, c->group[r][set], c->comm[r]));
    }
    NC(cu_api.ncclGroupEnd());
    for (size_t i = 0; i < st->nxfers; i++) { /* slices of an uneven reduce-scatter */
      const ntp_xfer *x = &st->xfers[i];
      const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
      if (s->rank != d->rank || !local_rank(c, s->rank) || box_eq(&d->box, &s->box)) continue;
      CU(cu_api.cudaSetDevice(c->dev[s->rank]));
      if (cu_copy_box(c, &d->box, &s->box, c->staging[s->rank], &d->box, dev_ptr(c, x->dst), s->dtype, c->comm[s->rank],
                   err, cap))
        return -1;
    }
    return 0;
  }
  /* pack what leaves, exchange, unpack what arrived; local moves are plain copies */
  used = calloc((size_t)p->world, sizeof *used);
  at = calloc(st->nxfers + 1, sizeof *at);
  recv_at = calloc(st->nxfers + 1, sizeof *recv_at);
  if (!used || !at || !recv_at) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank != d->rank || !local_rank(c, s->rank)) continue;
    CU(cu_api.cudaSetDevice(c->dev[s->rank]));
    if (cu_copy_box(c, &x->box, &s->box, dev_ptr(c, x->src), &d->box, dev_ptr(c, x->dst), s->dtype, c->comm[s->rank],
                 err, cap))
      goto fail;
  }
  if (exchange_remote(c, st, used, at, recv_at, err, cap) != 0) goto fail;
  for (size_t i = 0; i < st->nxfers; i++) {
    const ntp_xfer *x = &st->xfers[i];
    const ntp_tensor *s = &p->tensors[x->src], *d = &p->tensors[x->dst];
    if (s->rank == d->rank || !local_rank(c, d->rank)) continue;
    CU(cu_api.cudaSetDevice(c->dev[d->rank]));
    ntp_box packed = x->box;
    if (cu_copy_box(c, &x->box, &packed, c->staging[d->rank] + recv_at[i], &d->box, dev_ptr(c, x->dst), s->dtype,
                 c->comm[d->rank], err, cap))
      goto fail;
  }
  free(recv_at);
  free(used);
  free(at);
  return 0;
fail:
  free(recv_at);
  free(used);
  free(at);
  return -1;
}
