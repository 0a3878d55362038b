// SPDX-License-Identifier: GPL-2.0
/* softdta's local translation: the translator's XDP program (translator.bpf.c) running on the collector, with
 * the XDP responder's memory as its target. Each report becomes the
 * memory writes its RoCEv2 frames would have caused at the responder, executed by the same code
 * (include/execute.h), with no frame built or sent: build_roce is translator/local.h's, and emit drops the report.
 *
 * The responder's maps (arena, responder_config, responder_qp, responder_counters, ring_writes, completions) are
 * reused from its loaded object (softdta.engines.local.LocalTranslator), which tail-calls softdta_xdp for
 * reports to DTA_PORT.
 */
#define SOFTDTA_LOCAL 1

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "softdta_spec.h"
#include "execute.h"

#include "translator.bpf.c"
