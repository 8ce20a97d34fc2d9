/* run_model.c — load a compiled model library and run it, with nothing but its C ABI.
 *
 *   ntpc examples/gpt2.ntp -D B=2 -D S=16 -D L=2 -o gpt2.so
 *   cc -std=c17 examples/run_model.c $(pkg-config --cflags ntprt) -ldl -o run_model
 *   ./run_model ./gpt2.so [--seed N] [--params weights.safetensors] [--backend cpu|cuda]
 *
 * Inputs that are not passed keep the model's default initialisation (the same as
 * `ntpc run --seed N`), so this prints the same outputs as ntpc does.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <elf.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ntp_model.h"

typedef int (*get_info_fn)(const ntp_model_info **);
typedef int (*create_fn)(const ntp_model_options *, ntp_model **);
typedef int (*load_fn)(ntp_model *, const char *);
typedef int (*forward_fn)(ntp_model *, const DLTensor *const *, DLTensor *const *);
typedef const char *(*error_fn)(void);
typedef void (*destroy_fn)(ntp_model *);

static const char *dtype_str(DLDataType t) {
  if (t.code == kDLBfloat) return "bf16";
  if (t.code == kDLFloat) return t.bits == 16 ? "fp16" : "fp32";
  return "i32";
}

static float value_at(const DLTensor *t, int64_t i) {
  const unsigned char *p = t->data;
  if (t->dtype.code == kDLInt) return (float)((const int32_t *)p)[i];
  if (t->dtype.bits == 32) return ((const float *)p)[i];
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  if (t->dtype.code == kDLBfloat) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
  }
  /* fp16 */
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
  return h & 0x8000 ? -v : v;
}

/* dlopen maps a library's segments from the file as its program headers say; a file cut short
 * (a copy that did not finish) then faults (SIGBUS) inside the loader, so its size is checked
 * against the headers first. 0, or -1 with the reason printed. */
static int whole_elf(const char *path) {
  FILE *f = fopen(path, "rb");
  Elf64_Ehdr eh;
  long size = -1;
  int ok = f && fread(&eh, sizeof eh, 1, f) == 1 && !memcmp(eh.e_ident, ELFMAG, SELFMAG) &&
           eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_phentsize == sizeof(Elf64_Phdr) && fseek(f, 0, SEEK_END) == 0 &&
           (size = ftell(f)) >= 0;
  uint64_t need = ok ? eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize : 0;
  for (int i = 0; ok && i < eh.e_phnum; i++) {
    Elf64_Phdr ph;
    ok = fseek(f, (long)(eh.e_phoff + (uint64_t)i * sizeof ph), SEEK_SET) == 0 && fread(&ph, sizeof ph, 1, f) == 1;
    if (ok && ph.p_offset + ph.p_filesz > need) need = ph.p_offset + ph.p_filesz;
  }
  if (f) fclose(f);
  if (!ok) {
    fprintf(stderr, "run_model: %s: not a 64-bit ELF shared library\n", path);
    return -1;
  }
  if ((uint64_t)size < need) {
    fprintf(stderr, "run_model: %s: %ld bytes, its headers describe %llu (a truncated file?)\n", path, size,
            (unsigned long long)need);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: run_model MODEL.so [--seed N] [--params FILE] [--backend cpu|cuda]\n");
    return 2;
  }
  ntp_model_options opt = {.backend = "cpu", .rank = -1};
  const char *params = NULL;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seed")) opt.seed = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--params")) params = argv[i + 1];
    else if (!strcmp(argv[i], "--backend")) opt.backend = argv[i + 1];
  }
  if (whole_elf(argv[1]) != 0) return 1;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "run_model: %s\n", dlerror());
    return 1;
  }
  get_info_fn get_info = (get_info_fn)dlsym(lib, "ntp_model_get_info");
  create_fn create = (create_fn)dlsym(lib, "ntp_model_create");
  load_fn load = (load_fn)dlsym(lib, "ntp_model_load");
  forward_fn forward = (forward_fn)dlsym(lib, "ntp_model_forward");
  error_fn last_error = (error_fn)dlsym(lib, "ntp_model_last_error");
  destroy_fn destroy = (destroy_fn)dlsym(lib, "ntp_model_destroy");
  if (!get_info || !create || !load || !forward || !last_error || !destroy) {
    fprintf(stderr, "run_model: %s is not an ntp model library\n", argv[1]);
    return 1;
  }
  const ntp_model_info *info;
  get_info(&info);
  printf("model %s: %d ranks, %d inputs, %d outputs, %d params\n%s", info->name, info->world, info->n_inputs,
         info->n_outputs, info->n_params, info->sharding);

  ntp_model *m;
  if (create(&opt, &m) != 0 || (params && load(m, params) != 0)) {
    fprintf(stderr, "run_model: %s\n", last_error());
    return 1;
  }
  DLTensor *outs = calloc((size_t)info->n_outputs, sizeof *outs);
  DLTensor **outp = calloc((size_t)info->n_outputs, sizeof *outp);
  for (int o = 0; o < info->n_outputs; o++) {
    const ntp_model_tensor_info *ti = &info->outputs[o];
    int64_t n = 1;
    for (int d = 0; d < ti->ndim; d++) n *= ti->shape[d];
    outs[o] = (DLTensor){.data = malloc((size_t)n * (ti->dtype.bits / 8)), .device = {kDLCPU, 0}, .ndim = ti->ndim,
                         .dtype = ti->dtype, .shape = (int64_t *)ti->shape};
    outp[o] = &outs[o];
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (forward(m, NULL, outp) != 0) {
    fprintf(stderr, "run_model: %s\n", last_error());
    return 1;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("forward %.3f ms (%s backend)\n", ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6),
         opt.backend);
  for (int o = 0; o < info->n_outputs; o++) {
    const ntp_model_tensor_info *ti = &info->outputs[o];
    int64_t n = 1;
    printf("output %s : %s[", ti->name, dtype_str(ti->dtype));
    for (int d = 0; d < ti->ndim; d++) {
      printf("%s%lld", d ? ", " : "", (long long)ti->shape[d]);
      n *= ti->shape[d];
    }
    double sum = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; i++) {
      sum += value_at(&outs[o], i);
      abs_sum += fabs(value_at(&outs[o], i));
    }
    printf("]  sum=%.6e  mean|x|=%.6e  [", sum, n ? abs_sum / (double)n : 0.0);
    for (int64_t i = 0; i < n && i < 4; i++) printf("%s%.6g", i ? ", " : "", value_at(&outs[o], i));
    printf("%s]\n", n > 4 ? ", ..." : "");
    free(outs[o].data);
  }
  destroy(m);
  free(outs);
  free(outp);
  dlclose(lib);
  return 0;
}
