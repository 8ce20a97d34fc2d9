/* tensors.c — values in and out: inputs and parameters set from the host or from device memory,
 * outputs read back, slices and whole tensors moved between the host and the ranks. */
#include "cuda_internal.h"

/* Host floats of a tensor's box -> its storage bits on its GPU. */
static int upload(ntp_cuda *c, int32_t t, const float *vals, char *err, size_t cap) {
  const ntp_tensor *s = &c->p->tensors[t];
  int64_t n = box_volume(&s->box);
  size_t es = dtype_bytes(s->dtype);
  unsigned char *buf = malloc((size_t)n * es + 1);
  if (!buf) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (es == 4) memcpy(buf + 4 * i, &vals[i], 4);
    else {
      uint16_t b = s->dtype == NTP_BF16 ? ntp_float_to_bf16_bits(vals[i]) : ntp_float_to_f16_bits(vals[i]);
      memcpy(buf + 2 * i, &b, 2);
    }
  }
  CU(cu_api.cudaSetDevice(c->dev[s->rank]));
  CU(cu_api.cudaMemcpy(dev_ptr(c, t), buf, (size_t)n * es, cudaMemcpyHostToDevice));
  free(buf);
  c->graph_stale |= !c->filled[t]; /* its init kernel is not to run any more */
  c->filled[t] = true;
  return 0;
fail:
  free(buf);
  return -1;
}

int ntp_cuda_set(ntp_cuda *c, int32_t v, const ntp_host_tensor *g, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || s->init_value != v || !local_rank(c, s->rank)) continue;
    int64_t n = box_volume(&s->init_box);
    float *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
    if (!vals) return -1;
    /* gather the box from the global tensor, row-major; int32 values keep their bits */
    int nd = s->init_box.ndim;
    int64_t idx[NTP_MAX_RANK] = {0};
    for (int64_t k = 0; k < n; k++) {
      int64_t gi = 0;
      for (int d = 0; d < nd; d++) gi = gi * g->shape.dim[d] + s->init_box.lo[d] + idx[d];
      if (g->f) vals[k] = g->f[gi];
      else memcpy(&vals[k], &g->i[gi], 4);
      for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < s->init_box.hi[d] - s->init_box.lo[d]) break;
        idx[d] = 0;
      }
    }
    int rc = upload(c, (int32_t)t, vals, err, cap);
    free(vals);
    if (rc) return rc;
  }
  return 0;
}

int ntp_cuda_load(ntp_cuda *c, const ntp_safetensors *f, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || !local_rank(c, s->rank) ||
        p->global.ops[p->global.values[s->init_value].def].code != IR_PARAM)
      continue;
    const ntp_value *gv = &p->global.values[s->init_value];
    int64_t n = box_volume(&s->init_box);
    float *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
    if (!vals || ntp_safetensors_read_box(f, gv->name, gv->dtype, &gv->shape, &s->init_box, vals, err, cap) != 0 ||
        upload(c, (int32_t)t, vals, err, cap) != 0) {
      free(vals);
      return -1;
    }
    free(vals);
  }
  return 0;
}

/* Visits the runs of box x (contiguous along the last dim) inside a row-major tensor of
 * shape `outer`: fn(offset of the run in the tensor, offset in x packed, run length). */
static int box_runs(const ntp_box *x, const ntp_shape *outer, int (*fn)(void *, int64_t, int64_t, int64_t), void *ctx) {
  int nd = x->ndim;
  if (nd == 0) return fn(ctx, 0, 0, 1);
  int64_t len = x->hi[nd - 1] - x->lo[nd - 1], idx[NTP_MAX_RANK] = {0}, packed = 0;
  if (len <= 0) return 0;
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off = off * outer->dim[d] + x->lo[d] + (d == nd - 1 ? 0 : idx[d]);
    if (fn(ctx, off, packed, len) != 0) return -1;
    packed += len;
    int d = nd - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < x->hi[d] - x->lo[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return 0;
  }
}

typedef struct run_copy {
  unsigned char *global, *packed;
  size_t es;
  enum cudaMemcpyKind kind; /* the direction of the global tensor's side */
  bool to_global;
} run_copy;

static int copy_run(void *ctx, int64_t goff, int64_t poff, int64_t len) {
  run_copy *rc = ctx;
  unsigned char *g = rc->global + (size_t)goff * rc->es, *p = rc->packed + (size_t)poff * rc->es;
  size_t n = (size_t)len * rc->es;
  return (rc->to_global ? cu_api.cudaMemcpy(g, p, n, cudaMemcpyHostToDevice) : cu_api.cudaMemcpy(p, g, n, cudaMemcpyDeviceToHost)) ==
                 cudaSuccess
             ? 0
             : -1;
}

static ntp_box whole(const ntp_shape *s) {
  ntp_box b = {.ndim = s->ndim};
  for (int d = 0; d < s->ndim; d++) b.hi[d] = s->dim[d];
  return b;
}

int ntp_cuda_copy_to_host(ntp_cuda *c, void *dst, const void *src, size_t bytes, char *err, size_t cap) {
  (void)c;
  CU(cu_api.cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return 0;
fail:
  return -1;
}

int ntp_cuda_device_of(ntp_cuda *c, const void *data, int *dev) {
  (void)c;
  struct cudaPointerAttributes at;
  if (cu_api.cudaPointerGetAttributes(&at, data) != cudaSuccess || at.type != cudaMemoryTypeDevice) return -1;
  *dev = at.device;
  return 0;
}

/* Value v from a global tensor in device memory on GPU dev (storage dtype): each rank's box
 * is copied by a kernel on its own GPU, or through the host from another GPU. */
int ntp_cuda_set_device(ntp_cuda *c, int32_t v, const void *data, int dev, char *err, size_t cap) {
  const ntp_program *p = c->p;
  const ntp_value *gv = &p->global.values[v];
  ntp_box all = whole(&gv->shape);
  unsigned char *buf = NULL;
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || s->init_value != v || !local_rank(c, s->rank)) continue;
    size_t es = dtype_bytes(s->dtype), n = (size_t)box_volume(&s->init_box) * es;
    CU(cu_api.cudaSetDevice(c->dev[s->rank]));
    if (c->dev[s->rank] == dev) {
      if (cu_copy_box(c, &s->init_box, &all, (unsigned char *)data, &s->init_box, dev_ptr(c, (int32_t)t), s->dtype,
                   c->stream[s->rank], err, cap))
        goto fail;
      if (cu_wait_ranks(c, s->rank, s->rank + 1, err, cap) != 0) goto fail;
    } else {
      free(buf);
      if (!(buf = malloc(n + 1))) goto fail;
      run_copy rc = {(unsigned char *)data, buf, es, cudaMemcpyDeviceToHost, false};
      CU(cu_api.cudaSetDevice(dev));
      if (box_runs(&s->init_box, &gv->shape, copy_run, &rc) != 0) {
        snprintf(err, cap, "copying '%s' from GPU %d failed", gv->name, dev);
        goto fail;
      }
      CU(cu_api.cudaSetDevice(c->dev[s->rank]));
      CU(cu_api.cudaMemcpy(dev_ptr(c, (int32_t)t), buf, n, cudaMemcpyHostToDevice));
    }
    c->graph_stale |= !c->filled[t];
    c->filled[t] = true;
  }
  free(buf);
  return 0;
fail:
  free(buf);
  return -1;
}

/* Output o into a global tensor in device memory on GPU dev: the pieces this process holds
 * (a kernel copy on the same GPU, through the host from another); the rest is left as it was. */
int ntp_cuda_output_device(ntp_cuda *c, size_t o, void *data, int dev, char *err, size_t cap) {
  const ntp_program *p = c->p;
  int32_t v = p->global.outputs[o].value;
  const ntp_value *gv = &p->global.values[v];
  ntp_box all = whole(&gv->shape);
  unsigned char *buf = NULL;
  for (size_t k = 0; k < p->npieces[v]; k++) {
    int32_t t = p->pieces[v][k];
    const ntp_tensor *s = &p->tensors[t];
    if (!local_rank(c, s->rank)) continue;
    size_t es = dtype_bytes(s->dtype), n = (size_t)box_volume(&s->box) * es;
    CU(cu_api.cudaSetDevice(c->dev[s->rank]));
    if (c->dev[s->rank] == dev) {
      if (cu_copy_box(c, &s->box, &s->box, dev_ptr(c, t), &all, data, s->dtype, c->stream[s->rank], err, cap)) goto fail;
      if (cu_wait_ranks(c, s->rank, s->rank + 1, err, cap) != 0) goto fail;
      continue;
    }
    free(buf);
    if (!(buf = malloc(n + 1))) goto fail;
    CU(cu_api.cudaMemcpy(buf, dev_ptr(c, t), n, cudaMemcpyDeviceToHost));
    CU(cu_api.cudaSetDevice(dev));
    run_copy rc = {data, buf, es, cudaMemcpyHostToDevice, true};
    if (box_runs(&s->box, &gv->shape, copy_run, &rc) != 0) {
      snprintf(err, cap, "copying output '%s' to GPU %d failed", gv->name, dev);
      goto fail;
    }
  }
  free(buf);
  return 0;
fail:
  free(buf);
  return -1;
}

/* Output o into a host tensor in the global layout (fp32 values, int32 bits), from the pieces
 * this process holds; with one rank per process, the elements held elsewhere are NaN. */
int ntp_cuda_output_host(ntp_cuda *c, size_t o, ntp_host_tensor *h, char *err, size_t cap) {
  const ntp_program *p = c->p;
  const ntp_module *m = &p->global;
  int32_t v = m->outputs[o].value;
  const ntp_value *gv = &m->values[v];
  *h = (ntp_host_tensor){.name = m->outputs[o].name, .dtype = gv->dtype, .shape = gv->shape};
  int64_t n = shape_numel(&gv->shape);
  float *f = malloc((size_t)(n ? n : 1) * sizeof(float)); /* int32 outputs share the 4-byte slots */
  if (!f) {
    snprintf(err, cap, "out of host memory for output '%s'", gv->name);
    return -1;
  }
  for (int64_t i = 0; i < n; i++) f[i] = gv->dtype == NTP_I32 ? 0.0f : NAN;
  if (gv->dtype == NTP_I32) h->i = (int32_t *)f;
  else h->f = f;
  unsigned char *buf = NULL;
  for (size_t k = 0; k < p->npieces[v]; k++) {
    int32_t t = p->pieces[v][k];
    const ntp_tensor *s = &p->tensors[t];
    if (!local_rank(c, s->rank)) continue;
    int64_t pn = box_volume(&s->box);
    size_t es = dtype_bytes(s->dtype);
    free(buf);
    if (!(buf = malloc((size_t)pn * es + 1))) goto fail;
    CU(cu_api.cudaSetDevice(c->dev[s->rank]));
    CU(cu_api.cudaMemcpy(buf, dev_ptr(c, t), (size_t)pn * es, cudaMemcpyDeviceToHost));
    int nd = s->box.ndim;
    int64_t idx[NTP_MAX_RANK] = {0};
    for (int64_t e = 0; e < pn; e++) {
      int64_t gi = 0;
      for (int d = 0; d < nd; d++) gi = gi * gv->shape.dim[d] + s->box.lo[d] + idx[d];
      if (es == 4) {
        memcpy(&f[gi], buf + 4 * e, 4);
      } else {
        uint16_t b16;
        memcpy(&b16, buf + 2 * e, 2);
        f[gi] = s->dtype == NTP_BF16 ? ntp_bf16_bits_to_float(b16) : ntp_f16_bits_to_float(b16);
      }
      for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < s->box.hi[d] - s->box.lo[d]) break;
        idx[d] = 0;
      }
    }
  }
  free(buf);
  return 0;
fail:
  free(buf);
  free(f);
  h->f = NULL;
  h->i = NULL;
  if (!err[0]) snprintf(err, cap, "out of host memory for output '%s'", gv->name);
  return -1;
}

int ntp_cuda_alloc(ntp_cuda *c, int rank, size_t bytes, void **dev, char *err, size_t cap) {
  *dev = NULL;
  if (!local_rank(c, rank)) {
    snprintf(err, cap, "rank %d does not run in this process", rank);
    return -1;
  }
  void **nb = realloc(c->bufs, (c->nbufs + 1) * sizeof *nb);
  int *nd = realloc(c->buf_dev, (c->nbufs + 1) * sizeof *nd);
  if (nb) c->bufs = nb;
  if (nd) c->buf_dev = nd;
  if (!nb || !nd) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  CU(cu_api.cudaSetDevice(c->dev[rank]));
  CU(cu_api.cudaMalloc(dev, bytes ? bytes : 1));
  CU(cu_api.cudaMemsetAsync(*dev, 0, bytes ? bytes : 1, c->stream[rank]));
  c->bufs[c->nbufs] = *dev;
  c->buf_dev[c->nbufs++] = c->dev[rank];
  return 0;
fail:
  return -1;
}

int ntp_cuda_put(ntp_cuda *c, int rank, void *dev, const void *host, size_t bytes, char *err, size_t cap) {
  CU(cu_api.cudaSetDevice(c->dev[rank]));
  CU(cu_api.cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
  return 0;
fail:
  return -1;
}

int ntp_cuda_get(ntp_cuda *c, int rank, void *host, const void *dev, size_t bytes, char *err, size_t cap) {
  CU(cu_api.cudaSetDevice(c->dev[rank]));
  if (cu_wait_ranks(c, rank, rank + 1, err, cap) != 0) goto fail;
  CU(cu_api.cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
  return 0;
fail:
  return -1;
}

int ntp_cuda_tensor_get(ntp_cuda *c, int32_t t, float *host, char *err, size_t cap) {
  const ntp_tensor *s = &c->p->tensors[t];
  int64_t n = box_volume(&s->box);
  size_t es = dtype_bytes(s->dtype);
  unsigned char *buf = malloc((size_t)n * es + 1);
  if (!buf) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  if (ntp_cuda_get(c, s->rank, buf, dev_ptr(c, t), (size_t)n * es, err, cap) != 0) {
    free(buf);
    return -1;
  }
  for (int64_t i = 0; i < n; i++) {
    uint16_t b16;
    if (es == 4) memcpy(&host[i], buf + 4 * i, 4);
    else {
      memcpy(&b16, buf + 2 * i, 2);
      host[i] = s->dtype == NTP_BF16 ? ntp_bf16_bits_to_float(b16) : ntp_f16_bits_to_float(b16);
    }
  }
  free(buf);
  return 0;
}

int ntp_cuda_tensor_put(ntp_cuda *c, int32_t t, const float *host, char *err, size_t cap) {
  return upload(c, t, host, err, cap);
}

bool ntp_cuda_runs_rank(const ntp_cuda *c, int r) { return local_rank(c, r); }

bool ntp_cuda_all_here(const ntp_cuda *c) { return c->rank_lo == 0 && c->rank_hi == c->p->world; }

int ntp_cuda_merge(ntp_cuda *c, void *host, size_t bytes, char *err, size_t cap) {
  if (ntp_cuda_all_here(c) || bytes == 0) return 0;
  int r = c->rank_lo;
  void *d = NULL;
  CU(cu_api.cudaSetDevice(c->dev[r]));
  CU(cu_api.cudaMalloc(&d, bytes));
  CU(cu_api.cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  NC(cu_api.ncclAllReduce(d, d, bytes / 4, ncclInt32, ncclSum, c->world[r], c->stream[r]));
  if (cu_wait_ranks(c, r, r + 1, err, cap) != 0) goto fail;
  CU(cu_api.cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
  cu_api.cudaFree(d);
  return 0;
fail:
  if (d) cu_api.cudaFree(d);
  return -1;
}

int ntp_cuda_exchange(ntp_cuda *c, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                      char *err, size_t cap) {
  int W = c->p->world, me = c->rank_lo;
  size_t total = 0;
  for (int q = 0; q < W; q++)
    if (q != me) total += n_send[q] + n_recv[q];
  if (total == 0) return 0;
  float *d = NULL;
  CU(cu_api.cudaSetDevice(c->dev[me]));
  CU(cu_api.cudaMalloc((void **)&d, total * sizeof(float)));
  size_t at = 0;
  for (int q = 0; q < W; q++) /* the sends first, then the receives, each in rank order */
    if (q != me && n_send[q]) {
      CU(cu_api.cudaMemcpy(d + at, send[q], n_send[q] * sizeof(float), cudaMemcpyHostToDevice));
      at += n_send[q];
    }
  NC(cu_api.ncclGroupStart());
  size_t sat = 0, rat = at;
  for (int q = 0; q < W; q++) {
    if (q == me) continue;
    if (n_send[q]) NC(cu_api.ncclSend(d + sat, n_send[q], ncclFloat32, q, c->world[me], c->stream[me]));
    if (n_recv[q]) NC(cu_api.ncclRecv(d + rat, n_recv[q], ncclFloat32, q, c->world[me], c->stream[me]));
    sat += n_send[q];
    rat += n_recv[q];
  }
  NC(cu_api.ncclGroupEnd());
  if (cu_wait_ranks(c, me, me + 1, err, cap) != 0) goto fail;
  for (int q = 0; q < W; q++)
    if (q != me && n_recv[q]) {
      CU(cu_api.cudaMemcpy(recv[q], d + at, n_recv[q] * sizeof(float), cudaMemcpyDeviceToHost));
      at += n_recv[q];
    }
  cu_api.cudaFree(d);
  return 0;
fail:
  if (d) cu_api.cudaFree(d);
  return -1;
}
