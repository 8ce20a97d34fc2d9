/* launch.c — running the step list: each step enqueued on its rank's stream in the launch order,
 * collectives on the comm streams with their events, the whole captured as CUDA graphs and
 * replayed; per-layer profiling events. */
#include "cuda_internal.h"

/* The step's launch of kernel `kernel` (its own or its first pass) with its argument block. */
int cu_launch_step_kernel(ntp_cuda *c, int r, const cg_step *cs, int32_t kernel, int64_t grid, uint64_t seed, char *err,
                          size_t cap) {
  unsigned char *a = c->arena[r], *pp = c->persist[r];
  struct { long long v[CG_MAX_ARGS]; } block_args = {{0}}; /* the kernel's struct ntp_args */
  memcpy(block_args.v, c->cuda[r].args + cs->arg0, (size_t)cs->nargs * sizeof block_args.v[0]);
  void *args[] = {&a, &pp, &seed, &block_args};
  CU(cu_api.cudaLaunchKernel((const void *)c->kern[r][kernel], (dim3){(unsigned)grid, 1, 1}, (dim3){(unsigned)cs->block, 1, 1},
                         args, (size_t)cs->smem, c->stream[r]));
  return 0;
fail:
  return -1;
}

/* ---- per-layer device times (ntp_cuda_profile_layers) ---------------------------------------
 * An event on the first rank's stream wherever the step list enters another layer (and one at
 * its end): the time between two events is the device time of the steps of one layer, as the
 * first rank's stream sees it (with every rank on one GPU: all of them). */
static int profile_mark(ntp_cuda *c, int32_t layer, char *err, size_t cap) {
  if (c->nprof > 0 && c->prof_layer[c->nprof - 1] == layer) return 0;
  if (c->nprof > (int)c->p->n_steps) return 0;
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu_api.cudaEventRecord(c->prof_ev[c->nprof], c->stream[c->rank_lo]));
  c->prof_layer[c->nprof++] = layer;
  return 0;
fail:
  return -1;
}

int ntp_cuda_profile_layers(ntp_cuda *c, bool on, char *err, size_t cap) {
  if (on && !c->prof_ev) {
    c->prof_ev = calloc(c->p->n_steps + 1, sizeof *c->prof_ev);
    c->prof_layer = calloc(c->p->n_steps + 1, sizeof *c->prof_layer);
    if (!c->prof_ev || !c->prof_layer) {
      snprintf(err, cap, "out of memory (profiling events)");
      return -1;
    }
    CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
    for (size_t i = 0; i <= c->p->n_steps; i++) CU(cu_api.cudaEventCreate(&c->prof_ev[i]));
  }
  c->profile = on;
  c->nprof = 0;
  return 0;
fail:
  return -1;
}

int ntp_cuda_layer_times(const ntp_cuda *c, double *seconds, size_t n, char *err, size_t cap) {
  for (size_t l = 0; l < n; l++) seconds[l] = 0;
  if (!c->profile) {
    snprintf(err, cap, "layer profiling is off (ntp_cuda_profile_layers, NTP_CUDA_PROFILE=layers)");
    return -1;
  }
  for (int i = 0; i + 1 < c->nprof; i++) {
    float ms = 0;
    CU(cu_api.cudaEventElapsedTime(&ms, c->prof_ev[i], c->prof_ev[i + 1]));
    int32_t l = c->prof_layer[i];
    size_t at = l >= 0 && (size_t)l + 1 < n ? (size_t)l : n - 1; /* model level: the last entry */
    if (n) seconds[at] += ms / 1e3;
  }
  return 0;
fail:
  return -1;
}

/* The comm streams forked from the compute streams at the start of the step list (in a capture:
 * so they join it) and joined back at its end (so everything after, and a graph's end, follows
 * the collectives). */
static int fork_comm(ntp_cuda *c, bool join, char *err, size_t cap) {
  for (int r = c->rank_lo; c->overlap && r < c->rank_hi; r++) {
    if (cu_comm_rank(c, r) != r) continue;
    CU(cu_api.cudaSetDevice(c->dev[r]));
    cudaStream_t from = join ? c->comm[r] : c->stream[r], to = join ? c->stream[r] : c->comm[r];
    cudaEvent_t e = join ? c->join[r] : c->fork[r];
    CU(cu_api.cudaEventRecord(e, from));
    CU(cu_api.cudaStreamWaitEvent(to, e, 0));
  }
  return 0;
fail:
  return -1;
}

/* A collective: on the comm streams of the ranks taking part, after the compute enqueued before
 * it on each (the producers of what it reads are there), its end recorded for the compute steps
 * that wait for it (comm_deps.h). */
static int enqueue_comm(ntp_cuda *c, int32_t s, const ntp_step *st, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (int r = c->rank_lo; c->overlap && r < c->rank_hi; r++) {
    if (!c->done[(size_t)s * (size_t)p->world + (size_t)r]) continue;
    CU(cu_api.cudaSetDevice(c->dev[r]));
    CU(cu_api.cudaEventRecord(c->fork[r], c->stream[r]));
    CU(cu_api.cudaStreamWaitEvent(c->comm[r], c->fork[r], 0));
  }
  if (c->nccl ? cu_run_comm_nccl(c, s, st, err, cap) : cu_run_comm_loopback(c, st, err, cap)) return -1;
  for (int r = c->rank_lo; c->overlap && r < c->rank_hi; r++) {
    cudaEvent_t e = c->done[(size_t)s * (size_t)p->world + (size_t)r];
    if (!e) continue;
    CU(cu_api.cudaSetDevice(c->dev[r]));
    CU(cu_api.cudaEventRecord(e, c->comm[r]));
  }
  return 0;
fail:
  return -1;
}

/* Compute step s of rank r waits for the collectives whose memory it touches. */
static int wait_comms(ntp_cuda *c, size_t s, int r, char *err, size_t cap) {
  for (int32_t i = c->overlap ? c->deps.start[s] : 0; c->overlap && i < c->deps.start[s + 1]; i++) {
    cudaEvent_t e = c->done[(size_t)c->deps.wait[i] * (size_t)c->p->world + (size_t)cu_comm_rank(c, r)];
    if (e) CU(cu_api.cudaStreamWaitEvent(c->stream[r], e, 0));
  }
  return 0;
fail:
  return -1;
}

/* One step of the list: a collective on the comm streams, or a launch of a rank of this process
 * on its compute stream, after the waits for the collectives it touches. */
static int enqueue_step(ntp_cuda *c, size_t s, uint64_t seed, char *err, size_t cap) {
  const ntp_program *p = c->p;
  static const float one = 1.0f, zero = 0.0f; /* read by cuBLASLt at the call, or at the replay of a graph */
  const ntp_step *st = &p->steps[s];
  if (st->kind == SH_COMM) return enqueue_comm(c, (int32_t)s, st, err, cap);
  int r = st->rank;
  if (!local_rank(c, r)) return 0;
  const cg_step *cs = &c->cuda[r].steps[s];
  if (cs->kind != CG_GEMM && cs->kind != CG_KERNEL && cs->kind != CG_ATTENTION_GEMM) return 0;
  if (ntp_step_inits(st) && c->filled[st->op.result]) return 0;
  CU(cu_api.cudaSetDevice(c->dev[r]));
  if (wait_comms(c, s, r, err, cap) != 0) return -1;
  if (cs->kind == CG_GEMM) {
    gemm *g = &c->gemms[s];
    const ntp_op *mm = &p->steps[cs->mm].op; /* this step's, or the earlier matmul run here */
    unsigned char *a = dev_ptr(c, mm->args[0]), *b = dev_ptr(c, mm->args[1]), *d = dev_ptr(c, cs->out);
    LT(cu_api.cublasLtMatmul(c->lt[r], g->op, &one, b, g->a, a, g->b, &zero, d, g->c, d, g->c, &g->algo.algo,
                         c->workspace[r], g->algo.workspaceSize, c->stream[r]));
    return 0;
  }
  if (cs->kind == CG_ATTENTION_GEMM) return cu_run_attention_gemm(c, s, cs, seed, err, cap);
  if (cs->pre >= 0 && cu_launch_step_kernel(c, r, cs, cs->pre, cs->pre_grid, seed, err, cap) != 0) /* the first pass */
    return -1;
  return cu_launch_step_kernel(c, r, cs, cs->kernel, cs->grid, seed, err, cap);
fail:
  return -1;
}

/* Enqueues the step list on the streams: initialisation first (fused kernels may read a
 * parameter earlier in the list than its initialisation step), then everything else in the
 * launch order (launch_order.h: collectives overlapping the compute that does not need them;
 * step order with NTP_CUDA_OVERLAP=0); compute on the compute streams, collectives on the comm
 * streams. */
static int enqueue_steps(ntp_cuda *c, uint64_t seed, char *err, size_t cap) {
  const ntp_program *p = c->p;
  if (fork_comm(c, false, err, cap) != 0) return -1;
  for (size_t s = 0; s < p->n_steps; s++)
    if (ntp_step_inits(&p->steps[s]) && enqueue_step(c, s, seed, err, cap) != 0) return -1;
  for (size_t k = 0; k < c->order.n; k++) {
    size_t s = (size_t)c->order.step[k];
    if (c->profile && profile_mark(c, p->steps[s].layer, err, cap) != 0) return -1;
    if (enqueue_step(c, s, seed, err, cap) != 0) return -1;
  }
  if (c->profile && profile_mark(c, INT32_MIN, err, cap) != 0) return -1; /* the end of the last layer */
  return fork_comm(c, true, err, cap);
}

void cu_drop_graphs(ntp_cuda *c) {
  for (int r = c->rank_lo; c->graph && r < c->rank_hi; r++) {
    if (c->graph[r] && !(c->dead && c->dead[r])) cu_api.cudaGraphExecDestroy(c->graph[r]);
    c->graph[r] = NULL; /* a failed GPU's is left there */
  }
}

/* The step list as a CUDA graph per rank of this process, each captured on the rank's compute
 * stream (no host work per step at the replay). With NCCL, every rank's capture is open while
 * the steps are enqueued, so a group's calls for several ranks go to their own graphs (NCCL
 * 2.9 and later capture them); the graphs meet at the replay, as their NCCL kernels do. */
static int capture_graph(ntp_cuda *c, uint64_t seed, char *err, size_t cap) {
  cudaGraph_t g = NULL;
  int begun = c->rank_lo, rc = -1;
  cu_drop_graphs(c);
  for (; begun < c->rank_hi; begun++) {
    if (!stream_owner(c, begun)) continue;
    CU(cu_api.cudaSetDevice(c->dev[begun]));
    CU(cu_api.cudaStreamBeginCapture(c->stream[begun], cudaStreamCaptureModeThreadLocal));
  }
  rc = enqueue_steps(c, seed, err, cap);
fail:
  for (int r = c->rank_lo; r < begun; r++) { /* every capture begun is ended, also after a failure */
    if (!stream_owner(c, r)) continue;
    cu_api.cudaSetDevice(c->dev[r]);
    cudaError_t e = cu_api.cudaStreamEndCapture(c->stream[r], &g);
    if (e == cudaSuccess && rc == 0) e = cu_api.cudaGraphInstantiate(&c->graph[r], g, 0);
    if (g) cu_api.cudaGraphDestroy(g);
    g = NULL;
    if (e != cudaSuccess && rc == 0) {
      snprintf(err, cap, "%s:%d: capturing rank %d's steps: %s", __FILE__, __LINE__, r, cu_api.cudaGetErrorString(e));
      rc = -1;
    }
  }
  if (rc != 0) {
    cu_drop_graphs(c);
    size_t len = strlen(err);
    snprintf(err + len, cap - len, " (capturing the step list as CUDA graphs; NTP_CUDA_GRAPHS=0 runs it step by step)");
    return -1;
  }
  c->graph_seed = seed;
  c->graph_stale = false;
  return 0;
}

int ntp_cuda_run(ntp_cuda *c, uint64_t seed, double *seconds, char *err, size_t cap) {
  cu_nccl_last = ncclSuccess;
  c->nprof = 0;
  bool graphs = c->graphs && !c->profile; /* events between layers need the steps launched one by one */
  bool captured = c->graph[c->rank_lo] != NULL;
  if (graphs && (!captured || c->graph_seed != seed || c->graph_stale) && capture_graph(c, seed, err, cap) != 0)
    return -1;
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu_api.cudaEventRecord(c->ev0, c->stream[c->rank_lo]));
  double t0 = cu_host_now(); /* the host's part: the graph launches, or every step's calls */
  for (int r = c->rank_lo; graphs && r < c->rank_hi; r++) {
    if (!stream_owner(c, r)) continue;
    CU(cu_api.cudaSetDevice(c->dev[r]));
    CU(cu_api.cudaGraphLaunch(c->graph[r], c->stream[r]));
  }
  if (!graphs && enqueue_steps(c, seed, err, cap) != 0) return -1;
  c->host_s = cu_host_now() - t0;
  *(graphs ? &c->host_graph_s : &c->host_direct_s) = c->host_s;
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu_api.cudaEventRecord(c->ev1, c->stream[c->rank_lo]));
  if (cu_wait_streams(c, err, cap) != 0) goto fail; /* polled: a lost peer's operation never completes */
  float ms = 0;
  CU(cu_api.cudaEventElapsedTime(&ms, c->ev0, c->ev1));
  if (seconds) *seconds = ms / 1e3;
  return 0;
fail:
  return -1;
}

int ntp_cuda_use_graphs(ntp_cuda *c, bool on) {
  if (!on) cu_drop_graphs(c);
  if (on && c->no_graphs) return -1; /* several GPUs of this process joined by NCCL: step by step */
  c->graphs = on;
  return 0;
}

void ntp_cuda_host_time(const ntp_cuda *c, ntp_cuda_host *h) {
  int32_t layers = 0; /* distinct layer numbers of the steps */
  for (size_t s = 0; s < c->p->n_steps; s++)
    if (c->p->steps[s].layer + 1 > layers) layers = c->p->steps[s].layer + 1;
  *h = (ntp_cuda_host){.last_s = c->host_s, .graph_s = c->host_graph_s, .direct_s = c->host_direct_s,
                       .layers = layers > 0 ? layers : 1, .graphs = c->graphs};
}

int ntp_cuda_forward(ntp_cuda *c, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  const ntp_module *m = &c->p->global;
  *res = (ntp_cpu_result){0};
  if (ntp_cuda_run(c, seed, &res->seconds, err, cap) != 0) return -1;
  res->outputs = calloc(m->n_outputs + 1, sizeof *res->outputs);
  if (!res->outputs) {
    snprintf(err, cap, "out of host memory");
    return -1;
  }
  for (size_t o = 0; o < m->n_outputs; o++) {
    if (ntp_cuda_output_host(c, o, &res->outputs[o], err, cap) != 0) {
      ntp_cpu_result_free(res);
      return -1;
    }
    res->n_outputs++;
  }
  return 0;
}
