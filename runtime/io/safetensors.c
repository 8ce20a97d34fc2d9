/* safetensors.c — parameters in the safetensors format (8-byte header length, a JSON
 * header naming each tensor's dtype, shape and byte range, then the raw data), global
 * layout. Reading maps the file and copies only the boxes a rank asks for, so each rank
 * touches only its slices. The JSON is parsed and written with json-c. */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "param_formats.h"
#include "outfile.h"
#include "ntprt.h"

struct ntp_safetensors {
  unsigned char *map;
  size_t size;
  size_t data; /* offset of the data block */
  json_object *header;
  ntp_st_names *names; /* a format's name map (param_formats.c), or NULL: the model's names */
  char format[32];
};

static const char *st_dtype(ntp_dtype dt) {
  return dt == NTP_BF16 ? "BF16" : dt == NTP_FP16 ? "F16" : dt == NTP_FP32 ? "F32" : "I32";
}

enum { MAX_HEADER = 100000000 };

/* Bytes per element of a safetensors dtype, 0 if unknown. */
static size_t st_esize(const char *dt) {
  static const struct { const char *name; size_t size; } sizes[] = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (strcmp(dt, sizes[i].name) == 0) return sizes[i].size;
  return 0;
}

static bool nonneg_int(json_object *j, int64_t *out) {
  if (!j || !json_object_is_type(j, json_type_int)) return false;
  *out = json_object_get_int64(j);
  return *out >= 0;
}

typedef struct st_range {
  uint64_t begin, end;
  const char *name;
} st_range;

static int by_begin(const void *a, const void *b) {
  const st_range *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Every entry of the header checked once, when the file is opened, so that reading a box later
 * can trust it: an object with a known dtype, a shape of non-negative integers and two data
 * offsets inside the data block whose length is the shape's size, no two tensors overlapping. */
static int validate_header(ntp_safetensors *f, const char *path, char *err, size_t cap) {
  size_t n = (size_t)json_object_object_length(f->header), k = 0;
  st_range *r = calloc(n ? n : 1, sizeof *r);
  if (!r) {
    snprintf(err, cap, "%s: out of memory", path);
    return -1;
  }
  uint64_t data_len = f->size - f->data;
  int rc = -1;
  json_object_object_foreach(f->header, name, t) {
    if (strcmp(name, "__metadata__") == 0) continue;
    json_object *jd, *js, *jo;
    if (!json_object_is_type(t, json_type_object) || !json_object_object_get_ex(t, "dtype", &jd) ||
        !json_object_is_type(jd, json_type_string) || !json_object_object_get_ex(t, "shape", &js) ||
        !json_object_is_type(js, json_type_array) || !json_object_object_get_ex(t, "data_offsets", &jo) ||
        !json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2) {
      snprintf(err, cap, "%s: tensor '%s': the header entry needs a dtype string, a shape array and two data_offsets",
               path, name);
      goto done;
    }
    size_t esize = st_esize(json_object_get_string(jd));
    if (!esize) {
      snprintf(err, cap, "%s: tensor '%s': unknown dtype '%s'", path, name, json_object_get_string(jd));
      goto done;
    }
    uint64_t bytes = esize;
    size_t nd = json_object_array_length(js);
    for (size_t d = 0; d < nd; d++) {
      int64_t dim;
      if (!nonneg_int(json_object_array_get_idx(js, d), &dim)) {
        snprintf(err, cap, "%s: tensor '%s': shape entries must be non-negative integers", path, name);
        goto done;
      }
      if (__builtin_mul_overflow(bytes, (uint64_t)dim, &bytes)) bytes = UINT64_MAX;
    }
    int64_t b, e;
    if (!nonneg_int(json_object_array_get_idx(jo, 0), &b) || !nonneg_int(json_object_array_get_idx(jo, 1), &e) ||
        b > e || (uint64_t)e > data_len) {
      snprintf(err, cap, "%s: tensor '%s': data_offsets must be 0 <= begin <= end <= %llu (the data block)", path,
               name, (unsigned long long)data_len);
      goto done;
    }
    if ((uint64_t)(e - b) != bytes) {
      snprintf(err, cap, "%s: tensor '%s': data_offsets span %lld bytes, but its dtype and shape need %llu", path, name,
               (long long)(e - b), (unsigned long long)bytes);
      goto done;
    }
    r[k++] = (st_range){(uint64_t)b, (uint64_t)e, name};
  }
  qsort(r, k, sizeof *r, by_begin);
  for (size_t i = 1; i < k; i++)
    if (r[i].begin < r[i - 1].end) {
      snprintf(err, cap, "%s: tensors '%s' and '%s' overlap in the data block", path, r[i - 1].name, r[i].name);
      goto done;
    }
  rc = 0;
done:
  free(r);
  return rc;
}

void ntp_safetensors_close(ntp_safetensors *f) {
  if (!f) return;
  if (f->map) munmap(f->map, f->size);
  if (f->header) json_object_put(f->header);
  ntp_st_names_free(f->names);
  free(f);
}

int ntp_safetensors_open(const char *path, ntp_safetensors **out, char *err, size_t cap) {
  *out = NULL;
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    snprintf(err, cap, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat sb;
  ntp_safetensors *f = calloc(1, sizeof *f);
  if (!f || fstat(fd, &sb) != 0 || sb.st_size < 8) {
    snprintf(err, cap, "%s: not a safetensors file (too short)", path);
    close(fd);
    free(f);
    return -1;
  }
  f->size = (size_t)sb.st_size;
  f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    snprintf(err, cap, "cannot map %s: %s", path, strerror(errno));
    ntp_safetensors_close(f);
    return -1;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | f->map[i]; /* little-endian */
  if (n > f->size - 8) {
    snprintf(err, cap, "%s: header length %llu runs past the end of the file", path, (unsigned long long)n);
    ntp_safetensors_close(f);
    return -1;
  }
  if (n > MAX_HEADER) { /* the format's own limit; json-c takes an int length */
    snprintf(err, cap, "%s: header length %llu is larger than the format allows (100 MB)", path, (unsigned long long)n);
    ntp_safetensors_close(f);
    return -1;
  }
  json_tokener *tok = json_tokener_new();
  f->header = tok ? json_tokener_parse_ex(tok, (const char *)f->map + 8, (int)n) : NULL;
  json_tokener_free(tok);
  if (!f->header || !json_object_is_type(f->header, json_type_object)) {
    snprintf(err, cap, "%s: the header is not a JSON object", path);
    ntp_safetensors_close(f);
    return -1;
  }
  f->data = 8 + (size_t)n;
  if (validate_header(f, path, err, cap) != 0) {
    ntp_safetensors_close(f);
    return -1;
  }
  *out = f;
  return 0;
}

float ntp_f16_bits_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
  if (exp == 0) {
    if (man == 0) bits = sign;
    else { /* subnormal: normalise */
      exp = 113;
      while (!(man & 1024)) {
        man <<= 1;
        exp--;
      }
      bits = sign | exp << 23 | (man & 1023) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 112) << 23 | man << 13;
  }
  float x;
  memcpy(&x, &bits, 4);
  return x;
}

/* x is already an fp16 value (rounded): its exact bit pattern */
uint16_t ntp_float_to_f16_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
  int32_t exp = (int32_t)((b >> 23) & 255) - 127;
  uint32_t man = b & 0x7fffff;
  if (((b >> 23) & 255) == 255) return sign | 0x7c00 | (man ? 0x200 : 0);
  if (exp > 15) return sign | 0x7c00;
  if (exp >= -14) return sign | (uint16_t)((exp + 15) << 10) | (uint16_t)(man >> 13);
  if (exp < -25) return sign;
  return sign | (uint16_t)((man | 0x800000) >> (-exp - 1)); /* subnormal: exact for rounded inputs */
}

float ntp_bf16_bits_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float x;
  memcpy(&x, &bits, 4);
  return x;
}

uint16_t ntp_float_to_bf16_bits(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  return (uint16_t)(bits >> 16);
}

/* A tensor's header entry: its dtype, shape and data (checked when the file was opened). */
static int st_entry(const ntp_safetensors *f, const char *name, const char **fdt, ntp_shape *shape,
                    const unsigned char **base, char *err, size_t cap) {
  json_object *t, *jd, *js, *jo;
  if (!json_object_object_get_ex(f->header, name, &t)) {
    snprintf(err, cap, "parameter '%s' is not in the file", name);
    return -1;
  }
  if (strcmp(name, "__metadata__") == 0 || !json_object_is_type(t, json_type_object) ||
      !json_object_object_get_ex(t, "dtype", &jd) || !json_object_object_get_ex(t, "shape", &js) ||
      !json_object_object_get_ex(t, "data_offsets", &jo) || !json_object_is_type(js, json_type_array) ||
      !json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2) {
    snprintf(err, cap, "parameter '%s': incomplete header entry", name);
    return -1;
  }
  *fdt = json_object_get_string(jd);
  size_t esize = !strcmp(*fdt, "F32") ? 4 : (!strcmp(*fdt, "BF16") || !strcmp(*fdt, "F16")) ? 2 : 0;
  if (!esize) {
    snprintf(err, cap, "parameter '%s': dtype %s is not supported (BF16, F16, F32)", name, *fdt);
    return -1;
  }
  if (json_object_array_length(js) > NTP_MAX_RANK) {
    snprintf(err, cap, "parameter '%s': more than %d dims", name, NTP_MAX_RANK);
    return -1;
  }
  shape->ndim = (int)json_object_array_length(js);
  for (int d = 0; d < shape->ndim; d++) shape->dim[d] = json_object_get_int64(json_object_array_get_idx(js, (size_t)d));
  uint64_t begin = (uint64_t)json_object_get_int64(json_object_array_get_idx(jo, 0));
  uint64_t end = (uint64_t)json_object_get_int64(json_object_array_get_idx(jo, 1));
  if (end < begin || f->data + end > f->size || end - begin != (uint64_t)shape_numel(shape) * esize) {
    snprintf(err, cap, "parameter '%s': data offsets out of range", name);
    return -1;
  }
  *base = f->map + f->data + begin;
  return 0;
}

/* Box `box` of a tensor of dtype fdt and shape `shape` at base, as floats; `round_to`: a
 * conversion's target dtype, whose rounding the values get (NTP_FP32: none). */
static void st_copy_box(const unsigned char *base, const char *fdt, const ntp_shape *shape, const ntp_box *box,
                        ntp_dtype round_to, float *out) {
  size_t esize = !strcmp(fdt, "F32") ? 4 : 2;
  bool bf16 = !strcmp(fdt, "BF16");
  /* row-major walk of the box: runs along the last dim */
  int nd = shape->ndim;
  int64_t stride[NTP_MAX_RANK], idx[NTP_MAX_RANK] = {0};
  for (int64_t d = nd - 1, s = 1; d >= 0; d--) { /* 64-bit: a tensor may hold more than 2^31 elements */
    stride[d] = s;
    s *= shape->dim[d];
  }
  int64_t run = nd ? box->hi[nd - 1] - box->lo[nd - 1] : 1, k = 0, total = box_volume(box);
  while (k < total) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += (box->lo[d] + (d == nd - 1 ? 0 : idx[d])) * stride[d];
    const unsigned char *src = base + off * (int64_t)esize;
    for (int64_t i = 0; i < run; i++, k++) {
      if (esize == 4) memcpy(&out[k], src + 4 * i, 4);
      else {
        uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
        if (bf16) {
          uint32_t bits = (uint32_t)h << 16;
          memcpy(&out[k], &bits, 4);
        } else {
          out[k] = ntp_f16_bits_to_float(h);
        }
      }
      if (round_to == NTP_BF16) out[k] = ntp_round_bf16(out[k]);
      else if (round_to == NTP_FP16) out[k] = ntp_round_fp16(out[k]);
    }
    int d = nd - 2;
    while (d >= 0 && ++idx[d] >= box->hi[d] - box->lo[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

static bool box_inside(const ntp_box *box, const ntp_shape *shape) {
  for (int d = 0; d < shape->ndim; d++)
    if (box->lo[d] < 0 || box->hi[d] < box->lo[d] || box->hi[d] > shape->dim[d]) return false;
  return true;
}

/* Through a format's name map (param_formats.c): the model's tensor is a slice of the file's
 * tensor, maybe transposed, in any of the float dtypes (converted to the model's). */
static int read_mapped(const ntp_safetensors *f, const ntp_st_name *e, const char *name, ntp_dtype dt,
                       const ntp_shape *shape, const ntp_box *box, float *out, char *err, size_t cap) {
  const char *fdt;
  ntp_shape fs;
  const unsigned char *base;
  char e2[512];
  if (st_entry(f, e->source, &fdt, &fs, &base, e2, sizeof e2) != 0) {
    /* st_entry's message names the file's tensor, which this one names already */
    char pre[300];
    int pn = snprintf(pre, sizeof pre, "parameter '%s'", e->source);
    const char *why = e2;
    if (pn > 0 && (size_t)pn < sizeof pre && strncmp(e2, pre, (size_t)pn) == 0) why = e2 + pn + (e2[pn] == ':');
    snprintf(err, cap, "parameter '%s' (%s in the %s layout):%s%s", name, e->source, f->format, *why == ' ' ? "" : " ",
             why);
    return -1;
  }
  /* the model's box in the file's coordinates; the file's tensor is exactly the parts mapped into
   * it (param_formats.c), longer only where the layout allows a cut (a position table) */
  ntp_box src = *box;
  int64_t len = e->transpose ? (fs.ndim == 2 ? fs.dim[1] : -1) : (fs.ndim >= 1 ? fs.dim[0] : -1);
  bool fits = (len == e->extent || (e->longer_ok && len > e->extent)) &&
              (e->transpose ? shape->ndim == 2 && fs.ndim == 2 && fs.dim[0] == shape->dim[1] : fs.ndim == shape->ndim);
  for (int d = 1; fits && !e->transpose && d < shape->ndim; d++) fits = fs.dim[d] == shape->dim[d];
  if (!fits) {
    ntp_shape want = *shape; /* the file tensor this model's parts make up */
    if (e->transpose && shape->ndim == 2) want.dim[0] = shape->dim[1], want.dim[1] = e->extent;
    else if (shape->ndim >= 1) want.dim[0] = e->extent;
    char a[64], b[64], c[64];
    snprintf(err, cap, "parameter '%s' (%s in the %s layout): the file's shape %s should be %s%s for the model's %s%s",
             name, e->source, f->format, shape_str(&fs, a, sizeof a), shape_str(&want, c, sizeof c),
             e->longer_ok ? " (or longer)" : "", shape_str(shape, b, sizeof b), e->transpose ? " transposed" : "");
    return -1;
  }
  if (e->transpose) {
    src.lo[0] = box->lo[1], src.hi[0] = box->hi[1];
    src.lo[1] = box->lo[0] + e->offset, src.hi[1] = box->hi[0] + e->offset;
  } else {
    src.lo[0] += e->offset, src.hi[0] += e->offset;
  }
  ntp_dtype round_to = strcmp(fdt, st_dtype(dt)) == 0 || dt == NTP_FP32 ? NTP_FP32 : dt;
  if (!e->transpose) {
    st_copy_box(base, fdt, &fs, &src, round_to, out);
    return 0;
  }
  int64_t r = box->hi[0] - box->lo[0], c = box->hi[1] - box->lo[1];
  int64_t cnt = r * c;
  float *tmp = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof *tmp);
  if (!tmp) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  st_copy_box(base, fdt, &fs, &src, round_to, tmp); /* [c, r] */
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < c; j++) out[i * c + j] = tmp[j * r + i];
  free(tmp);
  return 0;
}

int ntp_safetensors_read_box(const ntp_safetensors *f, const char *name, ntp_dtype dt, const ntp_shape *shape,
                             const ntp_box *box, float *out, char *err, size_t cap) {
  if (!box_inside(box, shape)) {
    snprintf(err, cap, "parameter '%s': the slice asked for is outside the tensor", name);
    return -1;
  }
  const ntp_st_name *e = f->names ? ntp_st_names_find(f->names, name) : NULL;
  if (e) return read_mapped(f, e, name, dt, shape, box, out, err, cap);
  const char *fdt;
  ntp_shape fs;
  const unsigned char *base;
  if (st_entry(f, name, &fdt, &fs, &base, err, cap) != 0) return -1;
  if (strcmp(fdt, st_dtype(dt)) != 0) {
    snprintf(err, cap, "parameter '%s' is %s in the file but %s in the model", name, fdt, dtype_name(dt));
    return -1;
  }
  if (!shape_eq(&fs, shape)) {
    snprintf(err, cap, "parameter '%s': the file's shape differs from the model's", name);
    return -1;
  }
  st_copy_box(base, fdt, shape, box, NTP_FP32, out);
  return 0;
}

/* The header of tensors ts (their names, dtypes and shapes; data offsets one after another),
 * as a json object, with the data block's size. */
static json_object *st_header(const ntp_host_tensor *ts, size_t n, uint64_t *data_bytes) {
  json_object *h = json_object_new_object();
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    json_object *t = json_object_new_object(), *shape = json_object_new_array(), *offs = json_object_new_array();
    for (int d = 0; d < ts[i].shape.ndim; d++) json_object_array_add(shape, json_object_new_int64(ts[i].shape.dim[d]));
    uint64_t bytes = (uint64_t)shape_numel(&ts[i].shape) * dtype_bytes(ts[i].dtype);
    json_object_array_add(offs, json_object_new_int64((int64_t)off));
    json_object_array_add(offs, json_object_new_int64((int64_t)(off + bytes)));
    json_object_object_add(t, "dtype", json_object_new_string(st_dtype(ts[i].dtype)));
    json_object_object_add(t, "shape", shape);
    json_object_object_add(t, "data_offsets", offs);
    json_object_object_add(h, ts[i].name, t);
    off += bytes;
  }
  json_object *meta = json_object_new_object();
  json_object_object_add(meta, "format", json_object_new_string("pt"));
  json_object_object_add(meta, "producer", json_object_new_string("ntp"));
  json_object_object_add(h, "__metadata__", meta);
  *data_bytes = off;
  return h;
}

/* The 8-byte length and the header text, padded with spaces so that the data starts 8-aligned;
 * the data's offset in the file into *data_at. */
static bool st_write_header(FILE *f, json_object *h, uint64_t *data_at) {
  const char *text = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN);
  size_t len = strlen(text), padded = (len + 7) / 8 * 8;
  unsigned char hl[8];
  for (int i = 0; i < 8; i++) hl[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  bool ok = fwrite(hl, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
  for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
  *data_at = 8 + padded;
  return ok;
}

int ntp_safetensors_save(const char *path, const ntp_host_tensor *ts, size_t n, char *err, size_t cap) {
  uint64_t data_bytes, data_at;
  json_object *h = st_header(ts, n, &data_bytes);
  int rc = -1;
  ntp_outfile out;
  if (ntp_outfile_open(&out, path, NULL, err, cap) != 0) goto done;
  FILE *f = out.f;
  bool ok = st_write_header(f, h, &data_at);
  for (size_t i = 0; ok && i < n; i++) {
    int64_t cnt = shape_numel(&ts[i].shape);
    for (int64_t e = 0; ok && e < cnt; e++) {
      if (ts[i].dtype == NTP_FP32 || ts[i].dtype == NTP_I32) {
        ok = fwrite(ts[i].f ? (const void *)&ts[i].f[e] : (const void *)&ts[i].i[e], 4, 1, f) == 1;
      } else {
        uint32_t bits;
        memcpy(&bits, &ts[i].f[e], 4);
        uint16_t v = ts[i].dtype == NTP_BF16 ? (uint16_t)(bits >> 16) : ntp_float_to_f16_bits(ts[i].f[e]);
        unsigned char b2[2] = {(unsigned char)v, (unsigned char)(v >> 8)};
        ok = fwrite(b2, 1, 2, f) == 2;
      }
    }
  }
  if (ntp_outfile_commit(&out, ok && !ferror(f), err, cap) != 0) goto done;
  rc = 0;
done:
  json_object_put(h);
  return rc;
}

/* ---- other layouts (param_formats.c) -------------------------------------------------------- */

static bool st_has(void *ctx, const char *name) {
  json_object *t;
  return json_object_object_get_ex(((const ntp_safetensors *)ctx)->header, name, &t);
}

int ntp_safetensors_set_format(ntp_safetensors *f, const char *format, const ntp_module *m, char *err, size_t cap) {
  ntp_st_names *map;
  if (ntp_st_names_build(format, m, st_has, f, &map, err, cap) != 0) return -1;
  ntp_st_names_free(f->names);
  f->names = map;
  snprintf(f->format, sizeof f->format, "%s", format);
  return 0;
}

int ntp_safetensors_format_check(const char *format, const ntp_module *m, char *err, size_t cap) {
  ntp_st_names *map;
  if (ntp_st_names_build(format, m, NULL, NULL, &map, err, cap) != 0) return -1;
  ntp_st_names_free(map);
  return 0;
}

int ntp_safetensors_save_format(const char *path, const char *format, const ntp_module *m, const ntp_host_tensor *ts,
                                size_t n, char *err, size_t cap) {
  ntp_st_names *map;
  if (ntp_st_names_build(format, m, NULL, NULL, &map, err, cap) != 0) return -1;
  if (!map) return ntp_safetensors_save(path, ts, n, err, cap);
  /* the layout's tensors: each the union of the model tensors mapped into it */
  ntp_host_tensor *src = calloc(map->n ? map->n : 1, sizeof *src);
  const ntp_host_tensor **of = calloc(map->n ? map->n : 1, sizeof *of); /* each entry's model tensor */
  int32_t *into = calloc(map->n ? map->n : 1, sizeof *into);              /* each entry's layout tensor */
  size_t ns = 0;
  int rc = -1;
  if (!src || !of || !into) goto oom;
  for (size_t k = 0; k < map->n; k++) {
    const ntp_st_name *e = &map->e[k];
    for (size_t i = 0; i < n && !of[k]; i++)
      if (ts[i].name && !strcmp(ts[i].name, e->model)) of[k] = &ts[i];
    if (!of[k]) {
      snprintf(err, cap, "parameter '%s' is not among the tensors to write", e->model);
      goto done;
    }
    const ntp_shape *ms = &of[k]->shape;
    size_t j = 0;
    while (j < ns && strcmp(src[j].name, e->source) != 0) j++;
    if (j == ns) {
      src[ns].name = e->source, src[ns].dtype = of[k]->dtype, src[ns].shape = *ms;
      if (e->transpose) src[ns].shape.dim[0] = ms->dim[1], src[ns].shape.dim[1] = 0;
      else src[ns].shape.dim[0] = 0;
      ns++;
    }
    into[k] = (int32_t)j;
    int64_t *len = &src[j].shape.dim[e->transpose ? 1 : 0];
    if (e->offset + ms->dim[0] > *len) *len = e->offset + ms->dim[0];
  }
  for (size_t j = 0; j < ns; j++) {
    int64_t cnt = shape_numel(&src[j].shape);
    if (!(src[j].f = calloc((size_t)(cnt ? cnt : 1), sizeof(float)))) goto oom;
  }
  for (size_t k = 0; k < map->n; k++) {
    const ntp_st_name *e = &map->e[k];
    const ntp_host_tensor *t = of[k];
    ntp_host_tensor *d = &src[into[k]];
    int64_t rows = t->shape.dim[0], row = rows ? shape_numel(&t->shape) / rows : 0;
    for (int64_t i = 0; i < rows; i++)
      for (int64_t c = 0; c < row; c++)
        if (e->transpose) d->f[c * d->shape.dim[1] + e->offset + i] = t->f[i * row + c];
        else d->f[(e->offset + i) * row + c] = t->f[i * row + c];
  }
  rc = ntp_safetensors_save(path, src, ns, err, cap);
  goto done;
oom:
  snprintf(err, cap, "out of memory");
done:
  for (size_t j = 0; src && j < ns; j++) free(src[j].f);
  free(src), free(of), free(into);
  ntp_st_names_free(map);
  return rc;
}

/* ---- a file written by parts (ntp_st_writer) ---------------------------------------------- */

struct ntp_st_writer {
  ntp_outfile out;
  int fd;
  uint64_t data_at;
  uint64_t *off; /* per tensor: its data's offset in the data block */
  size_t n;
};

int ntp_st_writer_open(const char *path, const ntp_host_tensor *ts, size_t n, ntp_st_writer **out, char *err,
                       size_t cap) {
  *out = NULL;
  ntp_st_writer *w = calloc(1, sizeof *w);
  uint64_t data_bytes;
  json_object *h = w ? st_header(ts, n, &data_bytes) : NULL;
  if (!w || !h || !(w->off = malloc((n + 1) * sizeof *w->off))) {
    json_object_put(h);
    if (w) free(w->off);
    free(w);
    snprintf(err, cap, "out of memory");
    return -1;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    if (ts[i].dtype != NTP_FP32) {
      json_object_put(h);
      free(w->off);
      free(w);
      snprintf(err, cap, "'%s': a file by parts holds fp32 tensors", ts[i].name);
      return -1;
    }
    w->off[i] = off;
    off += (uint64_t)shape_numel(&ts[i].shape) * 4;
  }
  w->n = n;
  int rc = ntp_outfile_open(&w->out, path, NULL, err, cap);
  bool ok = rc == 0 && st_write_header(w->out.f, h, &w->data_at) && fflush(w->out.f) == 0;
  json_object_put(h);
  if (rc == 0) w->fd = fileno(w->out.f);
  /* the data block at its size, zeros until written: the parts land at their offsets */
  if (ok && ftruncate(w->fd, (off_t)(w->data_at + data_bytes)) != 0) ok = false;
  if (!ok) {
    if (rc == 0) ntp_outfile_commit(&w->out, false, err, cap);
    if (rc == 0) snprintf(err, cap, "cannot write '%s': %s", path, strerror(errno));
    free(w->off);
    free(w);
    return -1;
  }
  *out = w;
  return 0;
}

int ntp_st_writer_put(ntp_st_writer *w, size_t tensor, int64_t first, const float *vals, int64_t count) {
  if (tensor >= w->n || first < 0 || count < 0) return -1;
  const char *p = (const char *)vals;
  size_t left = (size_t)count * 4;
  off_t at = (off_t)(w->data_at + w->off[tensor] + (uint64_t)first * 4);
  while (left > 0) { /* little-endian fp32 as the host holds it (the writer above assumes the same) */
    ssize_t k = pwrite(w->fd, p, left, at);
    if (k <= 0) return -1;
    p += k;
    left -= (size_t)k;
    at += k;
  }
  return 0;
}

int ntp_st_writer_commit(ntp_st_writer *w, bool ok, char *err, size_t cap) {
  int rc = ntp_outfile_commit(&w->out, ok, err, cap);
  free(w->off);
  free(w);
  return ok ? rc : -1;
}
