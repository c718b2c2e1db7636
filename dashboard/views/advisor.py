"""Advisor: the controller's advice from observed traffic (fleet ratio, disaggregate or
colocate, with reasons), and a what-if calculator of KV size and transfer time."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, whatif
from dashboard.ui import errors, plot, reads
from dashboard.ui.figures import fmt_bytes, fmt_ms
from dashboard.ui.sidebar import run_every
from dashboard.ui.timerange import time_range
from pdctl_api import profiles
from pdctl_api.schema import AdvisorPublic, ClusterPublic, Role

ADVICE_EVERY_S = 10.0  # advice moves slowly: refreshed less often than the other cards
VERDICT_BOX = {"colocate": st.info, "depends": st.warning, "barely-pays": st.info,
               "disaggregate": st.success, "strongly-disaggregate": st.success}

st.title("Advisor")
st.caption(f"{time_range().label()} · the advice from `/api/v1/advisor` over the requests "
           "of the window; the what-if from `pdctl_api.profiles`")


def fleet(advice: AdvisorPublic, cluster: ClusterPublic) -> None:
    ratio = advice.fleet_ratio
    p, d = cluster.pools[Role.PREFILL].desired, cluster.pools[Role.DECODE].desired
    now_acc = (d.size * d.tp) / (p.size * p.tp) if p.size else float("inf")
    cols = st.columns(3)
    cols[0].metric("Decode : prefill accelerators",
                   f"{ratio.decode_per_prefill_accelerators:.2f} : 1",
                   help=f"{ratio.formula}; decode batch {ratio.decode_batch:.0f}"
                        f"{' (observed)' if ratio.decode_batch_observed else ' (assumed)'}")
    cols[1].metric("Decode : prefill instances",
                   f"{ratio.decode_per_prefill_instances:.2f} : 1",
                   help="the accelerator ratio at the pools' current TPs")
    cols[2].metric("Fleet now (accelerators)", f"{now_acc:.2f} : 1",
                   help=f"decode {d.size} x TP{d.tp}, prefill {p.size} x TP{p.tp}")


@st.fragment(run_every=ADVICE_EVERY_S if run_every() else None)
@errors.card
def advice_card() -> None:
    rng = time_range()
    advice, cluster = reads.advisor(rng), reads.cluster()
    verdict, traffic, kv = advice.verdict, advice.traffic, advice.kv_transfer
    st.caption(f"From the {traffic.requests:,} requests that started {rng.within()}")
    box = VERDICT_BOX.get(verdict.decision, st.info)
    box(f"**Verdict: {verdict.decision}**\n\n" +
        "\n".join(f"- {r}" for r in verdict.reasons))
    if traffic.note:
        st.caption(traffic.note)
    cols = st.columns(4)
    cols[0].metric("Requests observed", f"{traffic.requests}")
    cols[1].metric("Mean ISL", f"{traffic.mean_isl:.0f} tokens")
    cols[2].metric("Mean OSL", f"{traffic.mean_osl:.0f} tokens")
    cols[3].metric("Short requests", f"{traffic.short_request_share:.0%}",
                   help="ISL < 512 and OSL < 100")
    fleet(advice, cluster)
    observed = kv.observed_share_of_ttft_p50
    cols = st.columns(4)
    cols[0].metric(f"KV at mean ISL ({kv.link})", fmt_bytes(kv.kv_bytes_at_mean_isl))
    cols[1].metric("Transfer time", fmt_ms(kv.transfer_ms),
                   help=f"wire {kv.wire_ms:.2f} ms + link latency")
    cols[2].metric("Transfer share (model)", f"{kv.modelled_share_of_ttft:.0%}",
                   help="transfer / (prefill + transfer) at the mean ISL")
    cols[3].metric("Transfer share (observed p50)",
                   "n/a" if observed is None else f"{observed:.0%}")
    if kv.transfer_dominant:
        st.warning(f"KV transfer exceeds the alert share of TTFT ({kv.alert_share:.0%}) "
                   f"on {kv.link}.", icon=":material/warning:")


@st.fragment
def what_if(cluster: ClusterPublic) -> None:
    st.subheader("What if")
    models, links = sorted(profiles.MODELS), sorted(profiles.LINKS)
    name = cluster.model.name
    link = cluster.hardware.kv_link
    a, b, c = st.columns(3)
    model = a.selectbox("model", models, index=models.index(name) if name in models else 0,
                        key="whatif_model")
    tokens = b.number_input("prompt tokens", min_value=1, max_value=1_048_576, value=4096,
                            step=512, key="whatif_tokens")
    chosen = c.selectbox("KV link", links, index=links.index(link) if link in links else 0,
                         key="whatif_link", format_func=lambda n: (
                             f"{n} · {profiles.LINKS[n].bandwidth / 1e9:g} GB/s"))
    hw = cluster.hardware.accelerator
    tp = cluster.pools[Role.PREFILL].desired.tp
    est = whatif.estimate(model, int(tokens), chosen, hw, tp)
    cols = st.columns(4)
    cols[0].metric("KV cache", fmt_bytes(est.kv_bytes),
                   help="2 x layers x kv_heads x head_dim x tokens x dtype bytes")
    cols[1].metric("Wire time", fmt_ms(est.wire_ms), help="bytes / link bandwidth")
    cols[2].metric("Transfer time", fmt_ms(est.transfer_ms),
                   help="wire time + the link's typical latency")
    share = est.transfer_share
    cols[3].metric(f"Share vs prefill ({hw}, TP{tp})",
                   "n/a" if share is None else f"{share:.0%}",
                   help=None if est.prefill_ms is None else
                   f"prefill {est.prefill_ms:.1f} ms at TP{tp}: transfer / (prefill + "
                   "transfer), the lowest share of TTFT the transfer can take")
    plot.chart(st, charts.transfer_by_link(whatif.transfer_sweep(model, links), chosen,
                                           int(tokens)), width="stretch")


@errors.card
def what_if_card() -> None:
    what_if(reads.cluster())


advice_card()
what_if_card()
