/* emu_streams.c — streams, events and CUDA graphs of the emulated GPU, and the order in which
 * stream work runs.
 *
 * Work enqueued into a stream (a launch, a memset, a GEMM, a group of NCCL calls, an event record
 * or wait) becomes a node of the stream's queue. Which node runs next is the stream model
 * (NTP_EMU_STREAMS, emu.h):
 * - eager: after every enqueue, whatever can run runs, oldest first: work runs in program order,
 *   as a GPU with one queue would run it;
 * - lazy (the default with the race check on): nothing runs until the host synchronises (a stream
 *   or event synchronise, a synchronous copy or memset, a free); then, of the nodes at the heads of
 *   the queues that may run, the one enqueued last runs first. Only same-stream order, event waits
 *   and synchronisations are respected, so a dependency the program forgot to express (a
 *   collective on one stream reading what a kernel on another writes, a kernel overwriting what a
 *   collective still reads, a consumer not waiting for the collective it reads) runs in the wrong
 *   order and the result differs from the CPU's.
 * A group of NCCL calls is a node with two phases: posted when it reaches the head of its stream,
 * done when the emulated NCCL matched it with its peers' (emu_nccl.c); meanwhile the other streams
 * go on, so the per-rank parts of one collective, on the streams (or the graphs) of several
 * ranks, meet wherever each is enqueued.
 *
 * Stream capture: while a stream captures, its work is recorded as nodes of a graph, each on a
 * virtual stream; a stream that waits for an event recorded in the capture joins it (a fork), and
 * every forked stream must end with a record that another stream of the capture waits for (the
 * join) before cudaStreamEndCapture, as CUDA demands. A graph launch enqueues the graph's nodes
 * again: virtual stream 0 into the launch stream, the others into side streams of the executable
 * graph, with its own events for the forks and joins; so a replay runs in the same adversarial
 * order as direct launches do. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

enum { STREAM_MAGIC = 0x5354524d, EVENT_MAGIC = 0x45564e54, GRAPH_MAGIC = 0x47524150 };
typedef enum { N_WORK, N_COMM, N_RECORD, N_WAIT } node_kind;

typedef struct emu_event {
  int magic;
  uint64_t issued, completed; /* records enqueued; the last of them that ran */
  double t;                   /* when the last record ran */
  int refs;                   /* nodes that name it (freed at the last, once destroyed) */
  bool destroyed;
  uint64_t cap_graph;         /* a record captured in this graph (its id), at slot cap_slot */
  int cap_slot;
} emu_event;

typedef struct node {
  node_kind kind;
  int device;
  int (*run)(void *ctx);     /* N_WORK */
  const emu_comm_ops *comm;  /* N_COMM */
  void *ctx;                 /* owned; starts with its size in bytes */
  emu_event *ev;             /* N_RECORD, N_WAIT (in a stream queue) */
  uint64_t ticket;           /* N_RECORD: its number; N_WAIT: the record it waits for */
  int slot, vstream;         /* in a graph: the graph's event, the virtual stream */
  uint64_t order;            /* enqueue order (the lazy model runs the latest head first) */
  bool posted;               /* N_COMM: posted to the fabric, not yet done */
  struct node *next;
} node;

typedef struct emu_graph emu_graph;
typedef struct emu_stream {
  int magic, device, gen;
  node *head, *tail;
  emu_graph *capture; /* the graph it captures into, as virtual stream vstream */
  int vstream;
  struct emu_stream *next_live;
} emu_stream;

struct emu_graph {
  int magic;
  uint64_t id;
  node *nodes;
  size_t n, cap;
  int nv, nslots;
  bool exec;
  emu_stream **side; /* exec: the streams of virtual streams 1.. */
  emu_event **slots; /* exec: its events */
};

static emu_stream *live_streams;
static emu_stream legacy = {STREAM_MAGIC, 0, 0, NULL, NULL, NULL, 0, NULL}; /* the NULL stream */
static uint64_t enqueued, graph_ids;
static int capturing_streams;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

bool emu_streams_lazy(void) {
  const char *v = getenv("NTP_EMU_STREAMS");
  if (v && !strcmp(v, "eager")) return false;
  if (v && !strcmp(v, "lazy")) return true;
  return emu_racecheck() != 0;
}

static emu_stream *as_stream(const void *s) {
  if (!s) {
    if (!legacy.next_live && live_streams != &legacy) { /* registered at the first use */
      legacy.next_live = live_streams;
      live_streams = &legacy;
    }
    return &legacy;
  }
  return (emu_stream *)s;
}

bool emu_stream_ok(const void *s, const char *call) {
  if (!s) return emu_device_ok(emu_current_device(), call);
  const emu_stream *x = s;
  if (x->magic == STREAM_MAGIC) return x == &legacy ? emu_device_ok(x->device, call) : emu_object_ok(x->device, x->gen, call);
  emu_fail("%s: not a stream (destroyed, or never created)", call);
  return false;
}

bool emu_capturing(const void *stream) {
  const emu_stream *x = stream;
  return x && x->magic == STREAM_MAGIC && x->capture;
}
bool emu_any_capture(void) { return capturing_streams > 0; }

/* ---- the queues ------------------------------------------------------------------------------ */

static void event_unref(emu_event *e) {
  if (e && --e->refs == 0 && e->destroyed) free(e);
}
static void node_free(node *n) {
  /* a record freed unrun (its stream destroyed, its GPU failed) ends the waits on it, rather
   * than leaving them forever */
  if (n->kind == N_RECORD && n->ev && n->ticket > n->ev->completed) n->ev->completed = n->ticket;
  if (n->kind == N_COMM && n->comm->release) n->comm->release(n->ctx);
  free(n->ctx);
  event_unref(n->ev);
  free(n);
}

static int push(emu_stream *x, node proto) {
  node *n = malloc(sizeof *n);
  if (!n) {
    free(proto.ctx);
    emu_fail("stream work: out of host memory");
    return -1;
  }
  *n = proto;
  n->order = ++enqueued;
  n->next = NULL;
  n->posted = false;
  if (n->ev) n->ev->refs++;
  if (x->tail) x->tail->next = n;
  else x->head = n;
  x->tail = n;
  return 0;
}

static node *pop(emu_stream *x) {
  node *n = x->head;
  x->head = n->next;
  if (!x->head) x->tail = NULL;
  return n;
}

/* can the head of x run now? (a wait: once its record ran; a posted comm node: when done) */
static bool ready(const node *n) {
  if (n->kind == N_WAIT) return n->ev->completed >= n->ticket;
  return !(n->kind == N_COMM && n->posted);
}

static int run_node(emu_stream *x, char *why, size_t cap) {
  node *n = x->head;
  int saved = emu_current_device(), rc = 0;
  emu_use_device(n->device);
  switch (n->kind) {
  case N_WORK:
    rc = n->run(n->ctx);
    if (rc != 0) { /* sticky, as a fault on a GPU is */
      emu_set_sticky(cudaErrorLaunchFailure);
      snprintf(why, cap, "a kernel, memset or GEMM failed");
    }
    break;
  case N_RECORD:
    if (n->ticket > n->ev->completed) n->ev->completed = n->ticket;
    n->ev->t = now();
    break;
  case N_WAIT: break;
  case N_COMM:
    rc = n->comm->post(n->ctx);
    if (rc == 0) {
      n->posted = true;
      emu_use_device(saved);
      return 0; /* stays at the head until done */
    }
    snprintf(why, cap, "a NCCL operation failed");
    break;
  }
  emu_use_device(saved);
  node_free(pop(x));
  return rc;
}

/* Posted comm nodes that are done leave their queues; 1 when one did, -1 on a failure. */
static int poll_comms(bool *any_posted, bool *all_local, char *why, size_t cap) {
  int moved = 0;
  *any_posted = false;
  *all_local = true;
  for (emu_stream *x = live_streams; x; x = x->next_live) {
    node *n = x->head;
    if (!n || n->kind != N_COMM || !n->posted) continue;
    int r = n->comm->poll(n->ctx);
    if (r == 0) {
      *any_posted = true;
      *all_local &= n->comm->local(n->ctx);
      continue;
    }
    node_free(pop(x));
    if (r < 0) {
      snprintf(why, cap, "a NCCL operation failed");
      return -1;
    }
    moved = 1;
  }
  return moved;
}

/* The head to run next: eager, the oldest; lazy, the latest. */
static emu_stream *pick(bool lazy) {
  emu_stream *best = NULL;
  for (emu_stream *x = live_streams; x; x = x->next_live) {
    if (!x->head || !ready(x->head) || emu_device_failed(x->head->device)) continue;
    if (!best || (lazy ? x->head->order > best->head->order : x->head->order < best->head->order)) best = x;
  }
  return best;
}

static bool done(const emu_stream *target, const emu_event *ev) {
  if (ev) return ev->completed >= ev->issued;
  if (target) return !target->head;
  for (emu_stream *x = live_streams; x; x = x->next_live)
    if (x->head && !emu_device_failed(x->head->device)) return false;
  return true;
}

/* Runs stream work until `target` (or `ev`, or with both NULL every stream) has none left, or,
 * with `block` false, until nothing more can run without waiting (the eager model's step).
 * A wait that can never end (a collective whose peers in this process have all run out of work,
 * an event wait whose record nothing will run) is an error; a collective with a peer in another
 * process waits for it. 0, or -1 after emu_fail(). */
/* After an NCCL call failed (a mismatch the emulator detected, or a graph replaying a freed
 * communicator): the queued work is dropped at once, as the step list stops at the first error. A
 * peer that died or aborted is not such a failure: its operation stays posted for ever (drain). */
static void drop_all(void) {
  for (emu_stream *x = live_streams; x; x = x->next_live)
    while (x->head) node_free(pop(x));
}

static int drain(emu_stream *target, emu_event *ev, bool block, bool lazy) {
  char why[128] = "";
  for (;;) {
    bool posted, local;
    int moved = poll_comms(&posted, &local, why, sizeof why);
    if (moved < 0) {
      drop_all();
      return -1;
    }
    if (block && done(target, ev)) return 0;
    emu_stream *x = pick(lazy);
    if (x) {
      bool comm = x->head->kind == N_COMM;
      if (run_node(x, why, sizeof why) != 0) {
        if (comm) drop_all(); /* else a kernel's fault: sticky */
        return -1;
      }
      continue;
    }
    if (moved) continue;
    if (!block) return 0;
    if (posted) { /* NCCL: an operation whose peer died or aborted never completes, so this wait never returns */
      char stuck[300];
      for (emu_stream *y = live_streams; y; y = y->next_live)
        if (y->head && y->head->kind == N_COMM && y->head->posted && y->head->comm->stuck &&
            y->head->comm->stuck(y->head->ctx, stuck, sizeof stuck))
          emu_fatal("a blocking CUDA call (a synchronisation, a copy or a free) would never return: %s; NCCL's operation "
                    "never completes (poll cudaStreamQuery and ncclCommGetAsyncError, then ncclCommAbort)", stuck);
    }
    if (posted && !local) { /* a peer in another process: let it catch up */
      for (emu_stream *y = live_streams; y; y = y->next_live)
        if (y->head && y->head->kind == N_COMM && y->head->posted) {
          y->head->comm->idle(y->head->ctx);
          break;
        }
      continue;
    }
    if (posted) {
      for (emu_stream *y = live_streams; y; y = y->next_live)
        if (y->head && y->head->kind == N_COMM && y->head->posted) {
          y->head->comm->hang(y->head->ctx); /* says which call would hang */
          break;
        }
    } else {
      emu_fail("stream synchronisation would hang: a stream waits for an event whose record never runs");
    }
    return -1;
  }
}

int emu_sync_all(void) { return drain(NULL, NULL, true, emu_streams_lazy()); }
int emu_run_ready(void) { return drain(NULL, NULL, false, emu_streams_lazy()); }

/* Drops every queued node of GPU d (it failed: nothing of it runs any more). */
void emu_streams_drop_device(int d) {
  for (emu_stream *x = live_streams; x; x = x->next_live) {
    node **pp = &x->head, *last = NULL;
    while (*pp) {
      node *n = *pp;
      if (n->device == d) {
        *pp = n->next;
        node_free(n);
      } else {
        last = n;
        pp = &n->next;
      }
    }
    x->tail = last;
  }
}

bool emu_streams_comm_busy(const void *comm) {
  for (emu_stream *x = live_streams; x; x = x->next_live)
    for (node *n = x->head; n; n = n->next)
      if (n->kind == N_COMM && n->comm->uses(n->ctx, comm)) return true;
  return false;
}

/* Completes (without running) the queued NCCL nodes that use communicator comm: it is being
 * aborted or destroyed, and an aborted operation never completes. */
void emu_streams_cancel_comm(const void *comm) {
  for (emu_stream *x = live_streams; x; x = x->next_live) {
    node **pp = &x->head, *last = NULL;
    while (*pp) {
      node *n = *pp;
      if (n->kind == N_COMM && n->comm->uses(n->ctx, comm)) {
        *pp = n->next;
        node_free(n);
      } else {
        last = n;
        pp = &n->next;
      }
    }
    x->tail = last;
  }
}

/* ---- enqueue: captured into a graph, or queued (and, eager, run) ---------------------------- */

static int graph_add(emu_graph *g, node proto) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 64;
    node *n = realloc(g->nodes, cap * sizeof *n);
    if (!n) {
      free(proto.ctx);
      emu_fail("stream capture: out of host memory");
      return -1;
    }
    g->nodes = n;
    g->cap = cap;
  }
  proto.ev = NULL;
  g->nodes[g->n++] = proto;
  return 0;
}

static int enqueue(const void *stream, node proto) {
  emu_stream *x = as_stream(stream);
  if (x->capture) {
    proto.vstream = x->vstream;
    return graph_add(x->capture, proto);
  }
  if (push(x, proto) != 0) return -1;
  return emu_streams_lazy() ? 0 : drain(NULL, NULL, false, false);
}

int emu_enqueue(const void *stream, int (*run)(void *ctx), void *ctx) {
  return enqueue(stream, (node){.kind = N_WORK, .device = emu_current_device(), .run = run, .ctx = ctx});
}

int emu_enqueue_comm(const void *stream, const emu_comm_ops *ops, void *ctx) {
  emu_stream *x = as_stream(stream);
  if (!x->capture && ops->start(ctx) != 0) { /* a direct call takes its place in the communicator now */
    if (ops->release) ops->release(ctx);
    free(ctx);
    return -1;
  }
  return enqueue(stream, (node){.kind = N_COMM, .device = emu_current_device(), .comm = ops, .ctx = ctx});
}

/* ---- streams ----------------------------------------------------------------------------------- */

static emu_stream *stream_new(int device) {
  emu_stream *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  *x = (emu_stream){.magic = STREAM_MAGIC, .device = device, .gen = emu_device_gen(device), .next_live = live_streams};
  live_streams = x;
  return x;
}
static void stream_delete(emu_stream *x) {
  for (emu_stream **p = &live_streams; *p; p = &(*p)->next_live)
    if (*p == x) {
      *p = x->next_live;
      break;
    }
  while (x->head) node_free(pop(x));
  x->magic = 0;
  free(x);
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
  if (!emu_device_ok(emu_current_device(), "cudaStreamCreate")) return emu_error(cudaErrorInvalidDevice);
  emu_stream *x = stream_new(emu_current_device());
  if (!x) return emu_error(cudaErrorMemoryAllocation);
  *s = (cudaStream_t)x;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  (void)flags;
  return cudaStreamCreate(s);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s || !emu_stream_ok(s, "cudaStreamDestroy")) return emu_error(cudaErrorInvalidResourceHandle);
  emu_stream *x = (emu_stream *)s;
  /* CUDA lets the stream's work finish first */
  if (x->head && drain(x, NULL, true, emu_streams_lazy()) != 0) emu_set_sticky(cudaErrorLaunchFailure);
  stream_delete(x);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  if (!emu_stream_ok(s, "cudaStreamSynchronize")) return emu_error(cudaErrorInvalidResourceHandle);
  if (emu_capturing(s)) {
    emu_fail("cudaStreamSynchronize on a stream that is capturing");
    return emu_error(cudaErrorStreamCaptureUnsupported);
  }
  if (drain(as_stream(s), NULL, true, emu_streams_lazy()) != 0) {
    st = emu_sticky();
    return emu_error(st != cudaSuccess ? st : cudaErrorLaunchFailure);
  }
  st = emu_sticky();
  return st != cudaSuccess ? emu_error(st) : cudaSuccess;
}
/* Runs what can run now without waiting; cudaSuccess when nothing is left on s, else
 * cudaErrorNotReady (for ever, behind an NCCL operation whose peer died or aborted). */
cudaError_t cudaStreamQuery(cudaStream_t s) {
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  if (!emu_stream_ok(s, "cudaStreamQuery")) return emu_error(cudaErrorInvalidResourceHandle);
  if (emu_capturing(s)) {
    emu_fail("cudaStreamQuery on a stream that is capturing");
    return emu_error(cudaErrorStreamCaptureUnsupported);
  }
  emu_stream *x = as_stream(s);
  if (drain(x, NULL, false, emu_streams_lazy()) != 0) {
    st = emu_sticky();
    return emu_error(st != cudaSuccess ? st : cudaErrorLaunchFailure);
  }
  st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  return x->head ? cudaErrorNotReady : cudaSuccess; /* not ready is no error: cudaGetLastError stays clean */
}
cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  if (!emu_device_ok(emu_current_device(), "cudaDeviceSynchronize")) return emu_error(cudaErrorInvalidDevice);
  if (emu_sync_all() != 0) {
    st = emu_sticky();
    return emu_error(st != cudaSuccess ? st : cudaErrorLaunchFailure);
  }
  return cudaSuccess;
}

/* ---- events ------------------------------------------------------------------------------------ */

static bool event_ok(const emu_event *x) { return x && x->magic == EVENT_MAGIC; }

cudaError_t cudaEventCreate(cudaEvent_t *e) {
  emu_event *x = calloc(1, sizeof *x);
  if (!x) return emu_error(cudaErrorMemoryAllocation);
  x->magic = EVENT_MAGIC;
  x->refs = 1; /* the caller's */
  *e = (cudaEvent_t)x;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  (void)flags;
  return cudaEventCreate(e);
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  emu_event *x = (emu_event *)e;
  if (!event_ok(x) || !emu_stream_ok(s, "cudaEventRecord")) return emu_error(cudaErrorInvalidResourceHandle);
  emu_stream *y = as_stream(s);
  if (y->capture) { /* a node of the graph; a stream that waits for it joins the capture */
    x->cap_graph = y->capture->id;
    x->cap_slot = y->capture->nslots++;
    return graph_add(y->capture, (node){.kind = N_RECORD, .device = emu_current_device(), .slot = x->cap_slot,
                                        .vstream = y->vstream}) == 0
               ? cudaSuccess
               : emu_error(cudaErrorMemoryAllocation);
  }
  x->cap_graph = 0;
  return enqueue(s, (node){.kind = N_RECORD, .device = emu_current_device(), .ev = x, .ticket = ++x->issued}) == 0
             ? cudaSuccess
             : emu_error(cudaErrorLaunchFailure);
}

static emu_graph *graph_by_id(uint64_t id) {
  for (emu_stream *x = live_streams; x; x = x->next_live)
    if (x->capture && x->capture->id == id) return x->capture;
  return NULL;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)flags;
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  emu_event *x = (emu_event *)e;
  if (!event_ok(x) || !emu_stream_ok(s, "cudaStreamWaitEvent")) return emu_error(cudaErrorInvalidResourceHandle);
  emu_stream *y = as_stream(s);
  emu_graph *g = x->cap_graph ? graph_by_id(x->cap_graph) : NULL;
  if (g) { /* the event was recorded in a capture: the waiting stream joins it (a fork) */
    if (y->capture && y->capture != g) {
      emu_fail("cudaStreamWaitEvent: the stream captures into another graph than the one the event was recorded in");
      return emu_error(cudaErrorStreamCaptureIsolation);
    }
    if (!y->capture) {
      if (y == &legacy) {
        emu_fail("cudaStreamWaitEvent: the legacy default stream cannot join a capture");
        return emu_error(cudaErrorStreamCaptureImplicit);
      }
      y->capture = g;
      y->vstream = g->nv++;
      capturing_streams++;
    }
    return graph_add(g, (node){.kind = N_WAIT, .device = emu_current_device(), .slot = x->cap_slot,
                               .vstream = y->vstream}) == 0
               ? cudaSuccess
               : emu_error(cudaErrorMemoryAllocation);
  }
  if (y->capture) {
    emu_fail("cudaStreamWaitEvent: a capturing stream waits for an event recorded outside the capture");
    return emu_error(cudaErrorStreamCaptureIsolation);
  }
  if (!x->issued) return cudaSuccess; /* never recorded: nothing to wait for */
  return enqueue(s, (node){.kind = N_WAIT, .device = y->device, .ev = x, .ticket = x->issued}) == 0
             ? cudaSuccess
             : emu_error(cudaErrorLaunchFailure);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  emu_event *x = (emu_event *)e;
  if (!event_ok(x)) return emu_error(cudaErrorInvalidResourceHandle);
  if (drain(NULL, x, true, emu_streams_lazy()) != 0) return emu_error(cudaErrorLaunchFailure);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  emu_event *x = (emu_event *)a, *y = (emu_event *)b;
  if (!event_ok(x) || !event_ok(y) || !x->issued || !y->issued) return emu_error(cudaErrorInvalidResourceHandle);
  if (x->completed < x->issued || y->completed < y->issued) return emu_error(cudaErrorNotReady);
  *ms = (float)((y->t - x->t) * 1e3);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  emu_event *x = (emu_event *)e;
  if (!event_ok(x)) return emu_error(cudaErrorInvalidResourceHandle);
  x->magic = 0;
  x->destroyed = true;
  event_unref(x); /* freed once no queued node names it */
  return cudaSuccess;
}

/* ---- graphs ---------------------------------------------------------------------------------- */

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  (void)mode;
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  emu_stream *x = (emu_stream *)s;
  if (!x || !emu_stream_ok(s, "cudaStreamBeginCapture") || x->capture) {
    emu_fail("cudaStreamBeginCapture: %s", !x ? "the legacy default stream cannot capture" : "already capturing");
    return emu_error(cudaErrorStreamCaptureUnsupported);
  }
  emu_graph *g = calloc(1, sizeof *g);
  if (!g) return emu_error(cudaErrorMemoryAllocation);
  *g = (emu_graph){.magic = GRAPH_MAGIC, .id = ++graph_ids, .nv = 1};
  x->capture = g;
  x->vstream = 0;
  capturing_streams++;
  emu_capture_epoch_bump();
  return cudaSuccess;
}

static void graph_free(emu_graph *g) {
  for (size_t i = 0; i < g->n; i++) {
    if (g->nodes[i].kind == N_COMM && g->nodes[i].comm->release) g->nodes[i].comm->release(g->nodes[i].ctx);
    free(g->nodes[i].ctx);
  }
  for (int v = 1; g->side && v < g->nv; v++)
    if (g->side[v]) stream_delete(g->side[v]);
  for (int k = 0; g->slots && k < g->nslots; k++)
    if (g->slots[k]) cudaEventDestroy((cudaEvent_t)g->slots[k]);
  free(g->side);
  free(g->slots);
  free(g->nodes);
  g->magic = 0;
  free(g);
}

/* Every forked stream must have rejoined: its last node a record that another stream waits for. */
static bool joined(const emu_graph *g, int *v_out) {
  for (int v = 1; v < g->nv; v++) {
    const node *last = NULL;
    for (size_t i = 0; i < g->n; i++)
      if (g->nodes[i].vstream == v) last = &g->nodes[i];
    bool ok = last && last->kind == N_RECORD;
    bool waited = false;
    for (size_t i = 0; ok && i < g->n; i++)
      waited |= g->nodes[i].kind == N_WAIT && g->nodes[i].slot == last->slot && g->nodes[i].vstream != v;
    if (!ok || !waited) {
      *v_out = v;
      return false;
    }
  }
  return true;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  emu_stream *x = (emu_stream *)s;
  if (!x || !emu_stream_ok(s, "cudaStreamEndCapture") || !x->capture || x->vstream != 0) {
    emu_fail("cudaStreamEndCapture: %s", x && x->capture ? "not the stream the capture began on"
                                                          : "the stream is not capturing");
    return emu_error(cudaErrorIllegalState);
  }
  emu_graph *g = x->capture;
  int v = 0;
  bool ok = joined(g, &v);
  for (emu_stream *y = live_streams; y; y = y->next_live)
    if (y->capture == g) y->capture = NULL, capturing_streams--;
  emu_capture_epoch_bump();
  if (!ok) {
    emu_fail("cudaStreamEndCapture: stream %d of the capture (forked from it by an event wait) never rejoined the "
             "origin stream (its last work must be an event record that the capture waits for)", v);
    graph_free(g);
    *graph = NULL;
    return emu_error(cudaErrorStreamCaptureUnjoined);
  }
  *graph = (cudaGraph_t)g;
  return cudaSuccess;
}

/* an executable graph is a copy of the graph, with side streams and events of its own */
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  emu_graph *g = (emu_graph *)graph, *e = calloc(1, sizeof *e);
  if (!g || g->magic != GRAPH_MAGIC || g->exec) {
    free(e);
    return emu_error(cudaErrorInvalidValue);
  }
  if (!e) return emu_error(cudaErrorMemoryAllocation);
  *e = (emu_graph){.magic = GRAPH_MAGIC, .id = ++graph_ids, .nv = g->nv, .nslots = g->nslots, .exec = true,
                   .nodes = malloc((g->n + 1) * sizeof *e->nodes), .side = calloc((size_t)g->nv + 1, sizeof *e->side),
                   .slots = calloc((size_t)g->nslots + 1, sizeof *e->slots)};
  if (!e->nodes || !e->side || !e->slots) {
    graph_free(e);
    return emu_error(cudaErrorMemoryAllocation);
  }
  for (size_t i = 0; i < g->n; i++) { /* each node owns its context: copy it */
    node n = g->nodes[i];
    if (n.ctx) {
      size_t bytes = *(size_t *)n.ctx; /* every context starts with its size */
      void *c = malloc(bytes);
      if (!c) {
        graph_free(e);
        return emu_error(cudaErrorMemoryAllocation);
      }
      memcpy(c, n.ctx, bytes);
      if (n.kind == N_COMM && n.comm->copied) n.comm->copied(c);
      n.ctx = c;
    }
    e->nodes[e->n++] = n;
    if (n.vstream > 0 && !e->side[n.vstream] && !(e->side[n.vstream] = stream_new(n.device))) {
      graph_free(e);
      return emu_error(cudaErrorMemoryAllocation);
    }
  }
  for (int k = 0; k < e->nslots; k++)
    if (cudaEventCreate((cudaEvent_t *)&e->slots[k]) != cudaSuccess) {
      graph_free(e);
      return emu_error(cudaErrorMemoryAllocation);
    }
  *exec = (cudaGraphExec_t)e;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  cudaError_t st = emu_sticky();
  if (st != cudaSuccess) return emu_error(st);
  emu_graph *e = (emu_graph *)exec;
  if (!e || e->magic != GRAPH_MAGIC || !e->exec || !emu_stream_ok(s, "cudaGraphLaunch"))
    return emu_error(cudaErrorInvalidResourceHandle);
  if (emu_capturing(s)) {
    emu_fail("cudaGraphLaunch into a capturing stream is not emulated");
    return emu_error(cudaErrorStreamCaptureUnsupported);
  }
  /* NCCL's guide ("Using NCCL with CUDA graphs"): graphs whose NCCL calls are on communicators with
   * several GPUs in one process, launched from one thread, may deadlock (a launch may block until
   * the other GPUs' graphs run): one GPU per process, or a thread per GPU */
  for (size_t i = 0; i < e->n; i++)
    if (e->nodes[i].kind == N_COMM && e->nodes[i].comm->shared && e->nodes[i].comm->shared(e->nodes[i].ctx)) {
      emu_fail("cudaGraphLaunch: the graph holds NCCL calls of a communicator with several GPUs in this process, "
               "launched from one thread: NCCL's guide says this may deadlock (one GPU per process)");
      return emu_error(cudaErrorNotPermitted);
    }
  /* the copies first, each NCCL call taking its place in its communicator: a launch that cannot
   * (a communicator aborted by a peer, or gone) enqueues nothing, and fails without a sticky error */
  node *copy = calloc(e->n + 1, sizeof *copy);
  if (!copy) return emu_error(cudaErrorMemoryAllocation);
  size_t ready_n = 0;
  bool ok = true;
  for (; ok && ready_n < e->n; ready_n++) {
    node n = e->nodes[ready_n];
    if (n.ctx) {
      size_t bytes = *(size_t *)n.ctx;
      void *c = malloc(bytes);
      if (!c) {
        ok = false;
        break;
      }
      memcpy(c, n.ctx, bytes);
      if (n.kind == N_COMM && n.comm->copied) n.comm->copied(c);
      n.ctx = c;
      if (n.kind == N_COMM && n.comm->start(c) != 0) {
        if (n.comm->release) n.comm->release(c);
        free(c);
        ok = false;
        break;
      }
    }
    copy[ready_n] = n;
  }
  if (!ok) {
    for (size_t i = 0; i < ready_n; i++) {
      if (copy[i].kind == N_COMM && copy[i].comm->release) copy[i].comm->release(copy[i].ctx);
      free(copy[i].ctx);
    }
    free(copy);
    return emu_error(cudaErrorLaunchFailure);
  }
  for (size_t i = 0; i < e->n; i++) {
    node n = copy[i];
    emu_stream *to = n.vstream ? e->side[n.vstream] : as_stream(s);
    if (n.kind == N_RECORD || n.kind == N_WAIT) {
      n.ev = e->slots[n.slot];
      n.ticket = n.kind == N_RECORD ? ++n.ev->issued : n.ev->issued;
    }
    if (push(to, n) != 0) {
      for (size_t k = i + 1; k < e->n; k++) free(copy[k].ctx);
      free(copy);
      return emu_error(cudaErrorMemoryAllocation);
    }
  }
  free(copy);
  if (!emu_streams_lazy() && drain(NULL, NULL, false, false) != 0) return emu_error(cudaErrorLaunchFailure);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  emu_graph *e = (emu_graph *)exec;
  if (!e || e->magic != GRAPH_MAGIC || !e->exec) return emu_error(cudaErrorInvalidResourceHandle);
  /* CUDA: a graph in flight is not waited for; it is freed once its work completes. Here its side
   * streams run what they can now; with work left (a collective whose peer has not posted, or one
   * that never completes) the graph's handle dies at once and its streams live on. */
  bool left = false;
  for (int v = 1; v < e->nv; v++)
    if (e->side[v] && e->side[v]->head) {
      if (drain(e->side[v], NULL, false, emu_streams_lazy()) != 0) emu_set_sticky(cudaErrorLaunchFailure);
      left |= e->side[v]->head != NULL;
    }
  if (left) e->magic = 0; /* kept for the process's life, its streams still draining */
  else graph_free(e);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  emu_graph *g = (emu_graph *)graph;
  if (!g || g->magic != GRAPH_MAGIC || g->exec) return emu_error(cudaErrorInvalidResourceHandle);
  graph_free(g);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
  *status = emu_capturing(s) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
