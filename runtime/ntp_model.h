/* ntp_model.h — the C ABI of a compiled model library (model.so from `ntpc model.ntp -o model.so`).
 *
 * Every call returns 0 on success or a negative NTP_E* code; ntp_model_last_error() then says
 * why (thread-local). Tensors cross the boundary as DLPack DLTensors in the global layout:
 * the library gives each rank the slices its plan assigns. Inputs and outputs are dense,
 * row-major, with the model's storage dtype (bf16 = kDLBfloat 16, fp16 = kDLFloat 16,
 * fp32 = kDLFloat 32, i32 = kDLInt 32). Host tensors (kDLCPU) work on every backend; on the
 * cuda backend tensors may also live in device memory (kDLCUDA, device_id = the GPU): inputs
 * are copied slice by slice on the GPUs, outputs written there without a trip through the
 * host (a rank on another GPU goes through the host). With one rank per process, an output
 * holds the elements of that rank's pieces: NaN elsewhere in a host tensor, untouched
 * elsewhere in a device tensor.
 */
#ifndef NTP_MODEL_H
#define NTP_MODEL_H

#include <dlpack/dlpack.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NTP_MODEL_ABI_VERSION 1

#define NTP_RANK_FROM_ENV (-2)

enum { NTP_OK = 0, NTP_EINVAL = -1, NTP_ENOMEM = -2, NTP_EIO = -3, NTP_EBACKEND = -4, NTP_ERUN = -5 };

typedef struct ntp_model_tensor_info {
  const char *name;
  DLDataType dtype;
  int32_t ndim;
  const int64_t *shape;
} ntp_model_tensor_info;

typedef struct ntp_model_info {
  int32_t abi_version;
  const char *name;      /* the model's name in its .ntp file */
  int32_t world;         /* ranks the plan was compiled for */
  const char *sharding;  /* one line per layer: its placement */
  int32_t n_inputs, n_outputs, n_params;
  const ntp_model_tensor_info *inputs, *outputs, *params;
} ntp_model_info;

typedef struct ntp_model_options {
  const char *backend; /* "cpu" (all ranks simulated in this process) or "cuda"; NULL = "cpu" */
  int32_t rank;        /* cuda: this process's rank (one GPU, NCCL); -1 = every rank in this process
                          (GPUs device, device+1, ...; or all on one GPU with loopback);
                          NTP_RANK_FROM_ENV = from torchrun / Slurm / Open MPI variables */
  int32_t device;      /* cuda: the GPU of this rank (of the first rank when rank is -1) */
  int32_t loopback;    /* cuda: run every rank on one GPU, collectives as device copies */
  void *nccl_comm;     /* cuda: an initialised ncclComm_t for the world (one rank per process), or
                          NULL: created here (all ranks), or joined through the unique id that
                          rank 0 writes to $NTP_NCCL_ID_FILE */
  uint64_t seed;       /* default initialisation of parameters never set or loaded */
} ntp_model_options;

typedef struct ntp_model ntp_model;

int ntp_model_get_info(const ntp_model_info **info);
int ntp_model_create(const ntp_model_options *options, ntp_model **model);
/* Reads every parameter from a safetensors file (global layout); each rank reads its slices. */
int ntp_model_load(ntp_model *model, const char *safetensors_path);
/* The same from a checkpoint in another layout: "ntp" (as ntp_model_load), "hf-gpt2", "hf-llama"
 * (Hugging Face GPT-2 / Llama as published; docs/runtime.md#checkpoint-layouts). */
int ntp_model_load_format(ntp_model *model, const char *safetensors_path, const char *format);
/* Sets one parameter from a global tensor. */
int ntp_model_set_param(ntp_model *model, const char *name, const DLTensor *global);
/* inputs[i] / outputs[i] in the order of the info's inputs / outputs; outputs are filled. */
int ntp_model_forward(ntp_model *model, const DLTensor *const *inputs, DLTensor *const *outputs);
const char *ntp_model_last_error(void);
void ntp_model_destroy(ntp_model *model);

/* ---- training: a library built with `ntpc FILE --train -o model.so` (the cpu backend) ----
 * Its program carries the loss's backward and the gradients' sync; its outputs are the loss and
 * every parameter's gradient (grad.NAME), which ntp_model_forward computes without updating. */
typedef struct ntp_model_train_options {
  double lr;                /* this step's learning rate (the caller runs the schedule) */
  double beta1, beta2, eps; /* AdamW's */
  double weight_decay;      /* decoupled, on parameters of 2 or more dims */
  double clip;              /* the gradients' global norm clipped to this; 0: no clipping */
} ntp_model_train_options;
/* One AdamW step on fp32 master weights: inputs (in the info's order: tokens, targets, ...) ->
 * *loss, the loss before the update; options NULL: lr 1e-3, betas 0.9 0.95, eps 1e-8, weight
 * decay 0.1, clip 1. NTP_EINVAL on a library without a training step. */
int ntp_model_train_step(ntp_model *model, const ntp_model_train_options *options, const DLTensor *const *inputs,
                         double *loss);
/* A parameter's current value into a host tensor of its global shape: on the cpu backend as the
 * ranks hold it (set, loaded or the default initialisation), in a training library its master
 * rounded to the model's dtype; not on the cuda backend. */
int ntp_model_get_param(ntp_model *model, const char *name, DLTensor *global);
/* A training library's parameters set by an initialisation scheme, as ntpc train --init: "gpt2",
 * "megatron", "llama", "uniform", "comparison" (the model's own, the default of a library), or
 * NULL for the model family's (llama with an RMS norm, else gpt2); std <= 0: 0.02; drawn from the
 * options' seed. Before the first step. NTP_EINVAL for another name or a forward library. */
int ntp_model_init(ntp_model *model, const char *scheme, double std);

#ifdef __cplusplus
}
#endif
#endif
