// SPDX-License-Identifier: GPL-2.0
/* Benchmark harness around local translation (bpf/local.bpf.c): the translator's harness
 * (translator_bench.bpf.c: bench_restore, bench_translate) on the program built with SOFTDTA_LOCAL. */
#define SOFTDTA_LOCAL 1

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "softdta_spec.h"
#include "execute.h"

#include "translator_bench.bpf.c"
