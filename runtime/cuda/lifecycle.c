/* lifecycle.c — a backend made from a program (ntp_cuda_create: devices, streams, arenas,
 * kernels, communicators, the launch order and its events) and freed (ntp_cuda_free: after its work
 * is done, communicators finalised in one group). */
#include "cuda_internal.h"

/* The most workspace a GEMM's algorithm may ask for: NTP_CUBLASLT_WORKSPACE bytes (a K, M or G
 * suffix multiplies), 32 MiB by default (cuBLAS's recommendation for Hopper). */
static int workspace_cap(size_t *bytes, char *err, size_t cap) {
  const char *e = getenv("NTP_CUBLASLT_WORKSPACE");
  *bytes = (size_t)32 << 20;
  if (!e || !*e) return 0;
  char *end;
  unsigned long long v = strtoull(e, &end, 10);
  int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
  if (end == e || *e == '-' || (shift && *++end) || *end || v > (1ull << 40) >> shift) {
    snprintf(err, cap, "NTP_CUBLASLT_WORKSPACE='%s' is not a size in bytes (e.g. 33554432, 32M)", e);
    return -1;
  }
  *bytes = (size_t)(v << shift);
  return 0;
}

/* Each GPU's workspace, sized once, after every algorithm is chosen: the most any GEMM that
 * uses it needs (loopback: one for all ranks; none at all when no algorithm needs any). */
static int alloc_workspaces(ntp_cuda *c, char *err, size_t cap) {
  for (size_t s = 0; s < 2 * c->p->n_steps; s++) { /* [n_steps + s]: a GEMM attention's second */
    const ntp_step *st = &c->p->steps[s % c->p->n_steps];
    if (!c->gemms[s].ready) continue;
    int owner = c->nccl ? st->rank : c->rank_lo;
    if (c->gemms[s].algo.workspaceSize > c->workspace_size[owner]) c->workspace_size[owner] = c->gemms[s].algo.workspaceSize;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    int owner = c->nccl ? r : c->rank_lo;
    if (owner == r && c->workspace_size[r]) {
      CU(cu_api.cudaSetDevice(c->dev[r]));
      CU(cu_api.cudaMalloc(&c->workspace[r], c->workspace_size[r]));
    }
    c->workspace[r] = c->workspace[owner];
  }
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  return 0;
fail:
  return -1;
}

/* The rank whose comm stream runs rank r's part of the collectives (loopback: the one stream). */
int cu_comm_rank(const ntp_cuda *c, int r) { return c->nccl ? r : c->rank_lo; }

/* The launch order (launch_order.h: step order with NTP_CUDA_OVERLAP=0), the waits for the
 * collectives in it, and what it overlaps against step order (ntp_cuda_overlap_summary). */
static int plan_launches(ntp_cuda *c, char *err, size_t cap) {
  const ntp_program *p = c->p;
  ntp_launch_order steps = {0};
  ntp_comm_deps deps = {0};
  if (ntp_footprints_build(p, &c->fp) != 0 ||
      ntp_launch_order_build(p, &c->fp, c->rank_lo, c->rank_hi, c->overlap, &c->order) != 0)
    goto oom;
  if (!c->overlap) return 0;
  if (ntp_comm_deps_build(p, &c->fp, c->order.step, c->order.n, &c->deps) != 0) goto oom;
  ntp_overlap_measure(p, &c->order, &c->deps, &c->overlap_now);
  if (ntp_launch_order_build(p, &c->fp, c->rank_lo, c->rank_hi, false, &steps) != 0 ||
      ntp_comm_deps_build(p, &c->fp, steps.step, steps.n, &deps) != 0)
    goto oom;
  ntp_overlap_measure(p, &steps, &deps, &c->overlap_before);
  ntp_launch_order_free(&steps);
  ntp_comm_deps_free(&deps);
  return 0;
oom:
  ntp_launch_order_free(&steps);
  snprintf(err, cap, "out of host memory (the launch order)");
  return -1;
}

/* The events of the overlap: each collective's end on each rank of this process taking part
 * (comm_deps.h says which compute steps wait for it). */
static int comm_events(ntp_cuda *c, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMM) continue;
    for (int r = c->rank_lo; r < c->rank_hi; r++) {
      if (c->nccl ? !ntp_comm_takes_part(p, s, r) : r != c->rank_lo) continue; /* loopback: all on the one comm stream */
      CU(cu_api.cudaSetDevice(c->dev[r]));
      CU(cu_api.cudaEventCreateWithFlags(&c->done[s * (size_t)p->world + (size_t)r], cudaEventDisableTiming));
    }
  }
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  return 0;
fail:
  return -1;
}

void ntp_cuda_overlap_summary(const ntp_cuda *c, ntp_cuda_overlap *out) {
  *out = (ntp_cuda_overlap){.on = c->overlap, .ranks = c->nccl ? c->rank_hi - c->rank_lo : c->p->world,
                            .consumed = c->overlap_now.consumed, .overlapped = c->overlap_now.overlapped,
                            .overlapped_before = c->overlap_before.overlapped, .launches = c->overlap_now.launches,
                            .launches_before = c->overlap_before.launches, .moved = c->order.moved};
}

void ntp_cuda_gemm_summary(const ntp_cuda *c, ntp_cuda_gemms *out) {
  *out = (ntp_cuda_gemms){0};
  for (size_t s = 0; s < 2 * c->p->n_steps; s++) { /* [n_steps + s]: a GEMM attention's second */
    const gemm *g = &c->gemms[s];
    if (!g->ready) continue;
    size_t at = s % c->p->n_steps;
    out->gemms++;
    out->shapes += g->queried;
    out->epilogues[c->cuda[c->p->steps[at].rank].steps[at].epilogue]++;
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++)
    if (c->nccl || r == c->rank_lo) {
      out->gpus++;
      if (c->workspace_size[r] > out->workspace) out->workspace = c->workspace_size[r];
    }
  out->workspace_cap = c->workspace_cap;
}

/* What the environment asks of the backend: graphs, overlap, NCCL's timeout and blocking. */
static int read_settings(ntp_cuda *c, const ntp_cuda_options *o, char *err, size_t cap) {
  int W = c->p->world;
  const char *graphs = getenv("NTP_CUDA_GRAPHS"), *overlap = getenv("NTP_CUDA_OVERLAP"); /* 0: step by step; one stream */
  c->graphs = !(graphs && !strcmp(graphs, "0"));
  c->overlap = !(overlap && !strcmp(overlap, "0"));
  c->rank_lo = c->nccl ? o->rank_lo : 0;
  c->rank_hi = c->nccl && o->rank_hi > o->rank_lo ? o->rank_hi : W;
  const char *timeout = getenv("NTP_NCCL_TIMEOUT");
  c->nccl_timeout = timeout && atof(timeout) > 0 ? atof(timeout) : 600.0;
  if (c->nccl && c->rank_hi - c->rank_lo > 1) { /* several GPUs of one process joined by NCCL */
    /* NCCL's guide ("Using NCCL with CUDA graphs"): graphs of several GPUs launched from one thread
     * may deadlock (a launch may block until the other GPUs' graphs run); steps one by one */
    if (graphs && !strcmp(graphs, "1")) {
      snprintf(err, cap, "NTP_CUDA_GRAPHS=1: CUDA graphs holding the NCCL calls of several GPUs, launched from one "
               "thread, may deadlock (NCCL's guide); run one rank per process (--rank env) for graphs");
      return -1;
    }
    c->graphs = false;
    c->no_graphs = true;
  }
  if (c->nccl && cu_load_nccl(err, cap) != 0) return -1;
  /* non-blocking communicators where NCCL can tell their state (NTP_NCCL_BLOCKING=1: blocking ones) */
  const char *blocking = getenv("NTP_NCCL_BLOCKING");
  c->nonblocking = c->nccl && cu_api.ncclCommGetAsyncError && cu_api.ncclCommInitRankConfig && !(blocking && !strcmp(blocking, "1"));
  return 0;
}

/* The per-rank and per-step arrays (zeroed: ntp_cuda_free frees what was made). */
static int alloc_arrays(ntp_cuda *c) {
  const ntp_program *p = c->p;
  int W = p->world;
#define ALLOC(field) c->field = calloc((size_t)W + 1, sizeof *c->field)
  ALLOC(dev); ALLOC(stream); ALLOC(comm); ALLOC(fork); ALLOC(join); ALLOC(graph); ALLOC(lt); ALLOC(workspace); ALLOC(workspace_size);
  ALLOC(arena); ALLOC(persist); ALLOC(staging);
  ALLOC(staging_bytes); ALLOC(lib); ALLOC(kern); ALLOC(world);
#undef ALLOC
  c->gemms = calloc(2 * p->n_steps + 1, sizeof *c->gemms); /* [n_steps + s]: a GEMM attention's second */
  c->filled = calloc(p->n_tensors + 1, sizeof *c->filled);
  c->done = calloc(p->n_steps * (size_t)W + 1, sizeof *c->done);
  if (!c->dev || !c->stream || !c->comm || !c->fork || !c->join || !c->graph || !c->done || !c->lt || !c->workspace ||
      !c->workspace_size || !c->arena || !c->persist || !c->staging ||
      !c->staging_bytes || !c->lib || !c->kern || !c->world || !c->gemms || !c->filled)
    return -1;
  return 0;
}

/* Each rank's GPU: the options' device (loopback), their devices, or consecutive ones. */
static int place_devices(ntp_cuda *c, const ntp_cuda_options *o, char *err, size_t cap) {
  int W = c->p->world;
  int ndev = 0;
  CU(cu_api.cudaGetDeviceCount(&ndev));
  for (int r = 0; r < W; r++)
    c->dev[r] = !c->nccl ? o->device : o->devices ? o->devices[r] : o->device + (r - c->rank_lo);
  for (int r = c->rank_lo; c->nccl && o->devices && r < c->rank_hi; r++)
    if (o->devices[r] < 0 || o->devices[r] >= ndev) {
      snprintf(err, cap, "rank %d is to run on GPU %d, but %d are visible", r, o->devices[r], ndev);
      goto fail;
    }
  if (c->nccl && !o->devices && o->device + (c->rank_hi - c->rank_lo) > ndev) {
    snprintf(err, cap, "%d ranks need %d GPUs from GPU %d, but %d are visible; use loopback to run them on one",
             c->rank_hi - c->rank_lo, c->rank_hi - c->rank_lo, o->device, ndev);
    goto fail;
  }
  return 0;
fail:
  return -1;
}

/* Staging for packed transfers: the most one rank sends plus receives in one step. */
static int size_staging(ntp_cuda *c) {
  const ntp_program *p = c->p;
  int W = p->world;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMM) continue;
    size_t *need = calloc((size_t)W, sizeof *need);
    if (!need) return -1;
    for (size_t x = 0; need && x < st->nxfers; x++) {
      const ntp_tensor *src = &p->tensors[st->xfers[x].src], *dst = &p->tensors[st->xfers[x].dst];
      size_t b = ((size_t)box_volume(&st->xfers[x].box) * dtype_bytes(src->dtype) + 255) / 256 * 256;
      if (st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) b = (size_t)box_volume(&src->box) * 4 + 256;
      need[src->rank] += b;
      need[dst->rank] += b;
      if (st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER) /* reduce_by_exchange's accumulator */
        need[dst->rank] += (size_t)box_volume(&dst->box) * 4 + 256;
    }
    for (int r = 0; need && r < W; r++)
      if (need[r] > c->staging_bytes[r]) c->staging_bytes[r] = need[r];
    free(need);
  }
  return 0;
}

/* The ranks of this process: streams (loopback: one), cuBLASLt handles, device memory and their
 * kernels, from the compiled images. */
static int make_ranks(ntp_cuda *c, void **cubins, const int *first, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    CU(cu_api.cudaSetDevice(c->dev[r]));
    if (c->nccl || r == c->rank_lo) {
      CU(cu_api.cudaStreamCreate(&c->stream[r]));
      if (c->overlap) {
        CU(cu_api.cudaStreamCreate(&c->comm[r]));
        CU(cu_api.cudaEventCreateWithFlags(&c->fork[r], cudaEventDisableTiming));
        CU(cu_api.cudaEventCreateWithFlags(&c->join[r], cudaEventDisableTiming));
      } else {
        c->comm[r] = c->stream[r];
      }
      LT(cu_api.cublasLtCreate(&c->lt[r]));
    } else { /* loopback: one stream, one handle */
      c->stream[r] = c->stream[c->rank_lo];
      c->comm[r] = c->comm[c->rank_lo];
      c->lt[r] = c->lt[c->rank_lo];
    }
    size_t arena = p->cuda[r].scratch_bytes ? (size_t)(ntp_scratch_offset(p->mem[r].arena_bytes) + p->cuda[r].scratch_bytes)
                                            : (size_t)p->mem[r].arena_bytes; /* the scratch after the arena */
    CU(cu_api.cudaMalloc((void **)&c->arena[r], arena + 256));
    CU(cu_api.cudaMalloc((void **)&c->persist[r], (size_t)(p->mem[r].param_bytes + p->mem[r].input_bytes) + 256));
    if (c->nccl) CU(cu_api.cudaMalloc((void **)&c->staging[r], c->staging_bytes[r] + 256));
    char name[64];
    snprintf(name, sizeof name, "%s.rank%d.cu", p->global.name, r);
    if (cu_load_image(cubins[first[r]], name, &c->lib[r], err, cap) != 0) goto fail;
    c->kern[r] = calloc(p->cuda[r].nkernels + 1, sizeof *c->kern[r]);
    for (size_t k = 0; k < p->cuda[r].nkernels; k++)
      CU(cu_api.cudaLibraryGetKernel(&c->kern[r][k], c->lib[r], p->cuda[r].kernels[k].name));
  }
  return 0;
fail:
  return -1;
}

/* Every GEMM step's cuBLASLt description and algorithm (and GEMM attention's two). */
static int setup_gemms(ntp_cuda *c, char *err, size_t cap) {
  const ntp_program *p = c->p;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind != SH_COMPUTE || !local_rank(c, st->rank)) continue;
    cg_step_kind kind = p->cuda[st->rank].steps[s].kind;
    if (kind != CG_GEMM && kind != CG_ATTENTION_GEMM) continue;
    CU(cu_api.cudaSetDevice(c->dev[st->rank]));
    const cg_step *cs = &p->cuda[st->rank].steps[s];
    if (kind == CG_GEMM ? cu_gemm_setup(c, &p->steps[cs->mm], cs, &c->gemms[s], err, cap)
                        : cu_attention_gemm_setup(c, s, err, cap))
      return -1;
  }
  return 0;
fail:
  return -1;
}

int ntp_cuda_create(const ntp_program *p, const ntp_cuda_options *o, ntp_cuda **out, char *err, size_t cap) {
  *out = NULL;
  if (!p->cuda) {
    snprintf(err, cap, "the program carries no CUDA (compiled without the codegen pass)");
    return -1;
  }
  if (ntp_cuda_available(err, cap) != 0) return -1;
  int W = p->world;
  ntp_cuda *c = calloc(1, sizeof *c);
  void **cubins = calloc((size_t)W + 1, sizeof *cubins);
  int *first = calloc((size_t)W + 1, sizeof *first);
  if (!c || !cubins || !first) {
    free(c), free(cubins), free(first);
    return -1;
  }
  c->p = p;
  c->cuda = p->cuda;
  c->nccl = !o->loopback && W > 1;
  if (read_settings(c, o, err, cap) != 0) goto fail;
  if (alloc_arrays(c) != 0) goto oom;
  for (int r = c->rank_lo; c->nccl && o->nccl_world && r < c->rank_hi; r++) { /* taken over at once */
    c->world[r] = (ncclComm_t)o->nccl_world[r];
    o->nccl_world[r] = NULL;
    c->own_world = true;
  }
  if (place_devices(c, o, err, cap) != 0) goto fail;
  if (workspace_cap(&c->workspace_cap, err, cap) != 0) goto fail;
  if (size_staging(c) != 0) goto oom;
  int arch = c->arch = cu_compute_capability(c->dev[c->rank_lo], err, cap);
  /* every GPU inspected before anything runs on it (a repaired one among them): the kernels are
   * compiled once, for the first one's architecture */
  for (int r = c->rank_lo + 1; arch >= 0 && c->nccl && r < c->rank_hi; r++) {
    int a = cu_compute_capability(c->dev[r], err, cap);
    if (a >= 0 && a != arch) snprintf(err, cap, "GPU %d is sm_%d, GPU %d sm_%d: one architecture is needed", c->dev[r], a,
                                      c->dev[c->rank_lo], arch);
    if (a != arch) goto fail;
  }
  if (arch < 0 || cu_compile_ranks(c, arch, cubins, first, err, cap) != 0) goto fail;
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  CU(cu_api.cudaEventCreate(&c->ev0));
  CU(cu_api.cudaEventCreate(&c->ev1));
  if (make_ranks(c, cubins, first, err, cap) != 0) goto fail;
  CU(cu_api.cudaSetDevice(c->dev[c->rank_lo]));
  if (!c->nccl) {
    int64_t scratch = 1;
    for (size_t t = 0; t < p->n_tensors; t++)
      if (box_volume(&p->tensors[t].box) > scratch) scratch = box_volume(&p->tensors[t].box);
    CU(cu_api.cudaMalloc((void **)&c->scratch, (size_t)scratch * sizeof(float)));
  }
  if (cu_load_library(cu_comm_src, "ntp_collectives.cu", arch, &c->comm_lib, err, cap) != 0) goto fail;
  CU(cu_api.cudaLibraryGetKernel(&c->k_copy, c->comm_lib, "ntp_copy_box"));
  CU(cu_api.cudaLibraryGetKernel(&c->k_acc, c->comm_lib, "ntp_acc_box"));
  CU(cu_api.cudaLibraryGetKernel(&c->k_store, c->comm_lib, "ntp_store_acc"));
  if (setup_gemms(c, err, cap) != 0) goto fail;
  if (alloc_workspaces(c, err, cap) != 0) goto fail;
  if (c->nccl && (cu_nccl_world(c, o, err, cap) != 0 || cu_nccl_groups(c, err, cap) != 0)) goto fail;
  const char *prof = getenv("NTP_CUDA_PROFILE"); /* layers: per-layer device times */
  if (prof && !strcmp(prof, "layers") && ntp_cuda_profile_layers(c, true, err, cap) != 0) goto fail;
  if (plan_launches(c, err, cap) != 0 || (c->overlap && comm_events(c, err, cap) != 0)) goto fail;
  *out = c;
  for (int r = 0; r < W; r++) free(cubins[r]);
  free(cubins), free(first);
  return 0;
oom:
  snprintf(err, cap, "out of memory");
fail:
  for (int r = 0; r < W; r++) free(cubins[r]);
  free(cubins), free(first);
  ntp_cuda_free(c);
  return -1;
}

/* Every communicator of this process's live ranks, freed in one NCCL group (one thread may hold
 * several GPUs' ranks: NCCL's guide frees them together): destroyed, or, after a wait that saw a
 * lost peer or timed out, aborted (a destroy would wait for the peer for ever). */
static void free_comms(ntp_cuda *c) {
  if (!c->nccl || !c->world || !cu_api.nccl) return;
  cu_api.ncclGroupStart();
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    if (c->dead && c->dead[r]) continue; /* a failed GPU's: abandoned with it (ntp_cuda_free) */
    cu_api.cudaSetDevice(c->dev[r]);
    for (int k = 0; c->group && c->group[r] && k < c->nsets; k++)
      if (c->group[r][k]) {
        (c->wait_failed ? cu_api.ncclCommAbort : cu_api.ncclCommDestroy)(c->group[r][k]);
        c->group[r][k] = NULL;
      }
    if (c->world[r] && c->own_world) (c->wait_failed ? cu_api.ncclCommAbort : cu_api.ncclCommDestroy)(c->world[r]);
    c->world[r] = NULL;
  }
  cu_api.ncclGroupEnd();
}

void ntp_cuda_free(ntp_cuda *c) {
  if (!c) return;
  /* what is still queued (the last AdamW, with nothing read back after it) finishes before
   * anything it uses is freed: polled, as every wait on NCCL is */
  char why[512];
  if (c->stream && !c->wait_failed && cu_wait_streams(c, why, sizeof why) != 0) c->wait_failed = true;
  cu_drop_graphs(c); /* before the modules its kernels live in */
  free_comms(c);
  /* after an abort, what was queued behind the aborted operations runs: it ends before its memory,
   * descriptors and modules go (if it never does, they are left, as a failed GPU's are) */
  if (c->wait_failed && c->stream && cu_wait_streams(c, why, sizeof why) != 0) return;
  for (size_t e = 0; c->done && e < c->p->n_steps * (size_t)c->p->world; e++) {
    if (!c->done[e]) continue;
    int r = (int)(e % (size_t)c->p->world);
    if (c->dead && c->dead[r]) cu_abandon(c->done[e]);
    else cu_api.cudaSetDevice(c->dev[r]), cu_api.cudaEventDestroy(c->done[e]);
  }
  ntp_comm_deps_free(&c->deps);
  ntp_launch_order_free(&c->order);
  ntp_footprints_free(&c->fp);
  for (size_t s = 0; c->gemms && s < 2 * c->p->n_steps; s++) {
    gemm *g = &c->gemms[s];
    if (g->op) cu_api.cublasLtMatmulDescDestroy(g->op);
    if (g->a) cu_api.cublasLtMatrixLayoutDestroy(g->a);
    if (g->b) cu_api.cublasLtMatrixLayoutDestroy(g->b);
    if (g->c) cu_api.cublasLtMatrixLayoutDestroy(g->c);
  }
  for (int r = c->rank_lo; r < c->rank_hi; r++) {
    if (c->dead && c->dead[r]) { /* failed with its GPU: its memory, streams and handles are left there */
      for (int k = 0; c->group && c->group[r] && k < c->nsets; k++) cu_abandon(c->group[r][k]);
      if (c->group) free(c->group[r]);
      if (c->kern) free(c->kern[r]);
      if (c->world && c->own_world) cu_abandon(c->world[r]);
      if (c->lib) cu_abandon(c->lib[r]);
      bool owner = c->nccl || r == c->rank_lo;
      if (owner && c->lt) cu_abandon(c->lt[r]);
      if (owner && c->stream) cu_abandon(c->stream[r]);
      if (owner && c->overlap && c->comm) cu_abandon(c->comm[r]), cu_abandon(c->fork[r]), cu_abandon(c->join[r]);
      continue;
    }
    if (c->dev) cu_api.cudaSetDevice(c->dev[r]);
    if (c->group) free(c->group[r]); /* its communicators: free_comms */
    if (c->arena && c->arena[r]) cu_api.cudaFree(c->arena[r]);
    if (c->persist && c->persist[r]) cu_api.cudaFree(c->persist[r]);
    if (c->staging && c->staging[r]) cu_api.cudaFree(c->staging[r]);
    if (c->lib && c->lib[r]) cu_api.cudaLibraryUnload(c->lib[r]);
    if (c->kern) free(c->kern[r]);
    bool owner = c->nccl || r == c->rank_lo; /* loopback shares the first rank's stream and handle */
    if (owner && c->workspace && c->workspace[r]) cu_api.cudaFree(c->workspace[r]);
    if (owner && c->lt && c->lt[r]) cu_api.cublasLtDestroy(c->lt[r]);
    if (owner && c->stream && c->stream[r]) cu_api.cudaStreamDestroy(c->stream[r]);
    if (owner && c->overlap && c->comm && c->comm[r]) cu_api.cudaStreamDestroy(c->comm[r]);
    if (owner && c->fork && c->fork[r]) cu_api.cudaEventDestroy(c->fork[r]);
    if (owner && c->join && c->join[r]) cu_api.cudaEventDestroy(c->join[r]);
  }
  for (size_t b = 0; b < c->nbufs; b++) {
    if (cu_on_dead_gpu(c, c->buf_dev[b])) continue;
    cu_api.cudaSetDevice(c->buf_dev[b]);
    cu_api.cudaFree(c->bufs[b]);
  }
  free(c->bufs);
  free(c->buf_dev);
  free(c->partials); /* its buffers are among bufs */
  if (c->opt_lib) cu_api.cudaLibraryUnload(c->opt_lib);
  if (c->comm_lib) cu_api.cudaLibraryUnload(c->comm_lib);
  if (c->scratch) cu_api.cudaFree(c->scratch);
  bool ev_dead = c->dev && cu_on_dead_gpu(c, c->dev[c->rank_lo]); /* created there */
  if (c->ev0) ev_dead ? cu_abandon(c->ev0) : (void)cu_api.cudaEventDestroy(c->ev0);
  if (c->ev1) ev_dead ? cu_abandon(c->ev1) : (void)cu_api.cudaEventDestroy(c->ev1);
  for (size_t i = 0; c->prof_ev && i <= c->p->n_steps; i++)
    if (c->prof_ev[i]) ev_dead ? cu_abandon(c->prof_ev[i]) : (void)cu_api.cudaEventDestroy(c->prof_ev[i]);
  free(c->prof_ev);
  free(c->prof_layer);
  free(c->dead);
  free(c->dev);
  free(c->stream);
  free(c->comm);
  free(c->fork);
  free(c->join);
  free(c->done);
  free(c->graph);
  free(c->lt);
  free(c->workspace);
  free(c->workspace_size);
  free(c->arena);
  free(c->persist);
  free(c->staging);
  free(c->staging_bytes);
  free(c->lib);
  free(c->kern);
  free(c->world);
  free(c->group);
  free(c->step_set);
  free(c->sets);
  free(c->set_len);
  free(c->gemms);
  free(c->filled);
  free(c);
}
