/* train_compare.h — what the training equivalence tests compare: a sharded program's loss and
 * gradients against the unsharded reference's, and a few AdamW steps on each side. */
#ifndef NTP_TRAIN_COMPARE_H
#define NTP_TRAIN_COMPARE_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "exec.h"
#include "ntp_train.h"

/* max over outputs of max|a - b| / max|b|, where a gradient that vanishes (the key bias's:
 * softmax does not see it) is measured against 1e-3 of the model's largest gradient rather
 * than against its own round-off */
static double worst_error(const ntp_cpu_result *a, const ntp_cpu_result *b, const char **where) {
  double w = 0, floor = 0;
  for (size_t o = 1; o < b->n_outputs; o++) floor = fmax(floor, 1e-3 * ntp_max_abs(&b->outputs[o]));
  for (size_t o = 0; o < b->n_outputs; o++) {
    double e = ntp_max_rel_error_floor(&a->outputs[o], &b->outputs[o], o ? floor : 0);
    if (!(e <= w)) w = e, *where = b->outputs[o].name;
  }
  return w;
}

/* `steps` AdamW steps on each side (the default batches): the worst relative difference of the
 * losses and of the parameters and their optimizer state (masters, moments). AdamW divides every element's step by that element's own
 * gradient scale, so with the usual eps (1e-8) an element whose gradient is at round-off level
 * (1e-7 of the largest) moves by +-lr whichever way its last bits fall, on either side alike;
 * eps is 1e-4 here, so such an element's step is proportional to its gradient and the
 * comparison measures the updates, not the round-off. Parameters whose whole gradient vanishes
 * (the key bias: softmax does not see it) are not compared at all. 0, or -1 with err. */
/* max |a - b| / max |b| over n elements (0 when b is all zeros and a equals it) */
static double rel_error_n(const float *a, const float *b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t e = 0; e < n; e++) d = fmax(d, fabs((double)a[e] - b[e])), s = fmax(s, fabs((double)b[e]));
  return s > 0 ? d / s : d;
}

static int adamw_compare_on(const ntp_program *up, const ntp_program *sp, const ntp_exec_options *where, int steps,
                            double *lworst, double *pworst, size_t *skipped, char *err, size_t cap) {
  ntp_adamw aw;
  ntp_adamw_defaults(&aw);
  aw.steps = steps;
  aw.eps = 1e-4;
  ntp_trainer *tu = NULL, *ts = NULL;
  int rc = -1;
  *lworst = *pworst = 0;
  *skipped = 0;
  if (ntp_trainer_new(up, &aw, 3, NULL, NULL, &tu, err, cap) != 0 || ntp_trainer_new(sp, &aw, 3, NULL, where, &ts, err, cap) != 0)
    goto done;
  for (int k = 0; k < steps; k++) {
    ntp_train_stats a, b;
    if (ntp_trainer_step(tu, NULL, 0, &a, err, cap) != 0 || ntp_trainer_step(ts, NULL, 0, &b, err, cap) != 0) goto done;
    *lworst = fmax(*lworst, fabs(a.loss - b.loss) / fmax(fabs(a.loss), 1e-30));
  }
  const ntp_host_tensor *pa, *pb;
  size_t na = ntp_trainer_params(tu, &pa), nb = ntp_trainer_params(ts, &pb);
  if (na != nb) {
    snprintf(err, cap, "%zu parameters against %zu", na, nb);
    goto done;
  }
  const ntp_cpu_result *last = ntp_trainer_last(tu);
  double floor = 0;
  for (size_t o = 1; o < last->n_outputs; o++) floor = fmax(floor, 1e-3 * ntp_max_abs(&last->outputs[o]));
  for (size_t i = 0; i < na; i++) {
    char gname[256];
    snprintf(gname, sizeof gname, "grad.%s", pa[i].name);
    bool vanishing = false;
    for (size_t o = 1; o < last->n_outputs; o++)
      if (!strcmp(last->outputs[o].name, gname)) vanishing = ntp_max_abs(&last->outputs[o]) < floor;
    if (vanishing) {
      ++*skipped;
      continue;
    }
    *pworst = fmax(*pworst, ntp_max_rel_error(&pb[i], &pa[i]));
    /* the optimizer's state too: the masters and both moments (a distributed optimizer keeps them
     * on the owners of each part alone: a part lost or updated twice shows here) */
    const float *ua[3], *sa[3];
    if (ntp_trainer_state(tu, i, &ua[0], &ua[1], &ua[2], err, cap) != 0 ||
        ntp_trainer_state(ts, i, &sa[0], &sa[1], &sa[2], err, cap) != 0)
      goto done;
    int64_t n = 1;
    for (int d = 0; d < pa[i].shape.ndim; d++) n *= pa[i].shape.dim[d];
    for (int k = 0; k < 3; k++) *pworst = fmax(*pworst, rel_error_n(sa[k], ua[k], n));
  }
  rc = 0;
done:
  ntp_trainer_free(tu);
  ntp_trainer_free(ts);
  return rc;
}

/* The same, the sharded side where `where` says (NULL: every rank simulated on the CPU). */
static inline int adamw_compare(const ntp_program *up, const ntp_program *sp, int steps, double *lworst,
                                double *pworst, size_t *skipped, char *err, size_t cap) {
  return adamw_compare_on(up, sp, NULL, steps, lworst, pworst, skipped, err, cap);
}

#endif
