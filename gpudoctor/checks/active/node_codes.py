"""The codes of the multi-node view (checks/active/nodes.py) and of `gpudoctor fleet`, which judges
the same facts from saved files: GD443, GD460-GD464, GD680-GD684."""

from __future__ import annotations

from gpudoctor.engine.codes import Code

COUNTERS_GROWING = Code(
    "GD443",
    "rdma-port-errors-growing",
    "InfiniBand/RoCE error counters do not grow during the run",
    what="Reads every RDMA port's error counters when gpudoctor starts and again after the active run "
    "(on every node under torchrun/srun) and reports those that rose: link_downed or link_error_recovery "
    "rising fails (the link went down or retrained while traffic ran), symbol_error, port_rcv_errors or "
    "excessive_buffer_overrun_errors rising warns. A counter already saturated cannot rise and is named.",
    why="A counter that rises under load is a link failing now, not an old event: NCCL connections over it "
    "fail ('IB completion with error', watchdog timeouts) or slow down with retransmissions. Which "
    "counter rises is a heuristic of what is wrong (symbol errors: signal quality; link downed: flaps).",
    fix="Drain the node; reseat or replace the cable/transceiver of the named port; look at the switch "
    "port's counters too (`ibqueryerrors`, `perfquery`); clear the counters (`perfquery -x`) and re-run.",
)
STACK_DIFFERS = Code(
    "GD460",
    "node-stack-differs",
    "Every node runs the same driver, CUDA, NCCL and torch",
    what="Compares, across the nodes of a torchrun/srun job, the NVIDIA driver, the CUDA version the driver "
    "supports, the NCCL torch bundles and the torch version, and names the nodes that differ from the "
    "majority. `gpudoctor fleet` judges the same facts (GD460-GD463) from the snapshots or reports each "
    "node saved.",
    why="NCCL refuses to start across different NCCL versions ('Mismatched NCCL version detected', "
    "src/init.cc: every rank fails at init). Different drivers or torch builds give different kernels "
    "and timings on one node: a slow or failing rank paces or breaks the whole job.",
    fix="Use one container image or environment on every node; upgrade or pin the odd node's driver and "
    "packages to the others'.",
)
GPUS_DIFFER = Code(
    "GD461",
    "node-gpus-differ",
    "Every node has the same GPUs",
    what="Compares the GPU models and counts of each node (the GPUs NVML sees, as every report's `facts` "
    "block lists them) and their active NVLinks.",
    why="A data-parallel step waits for the slowest rank: a node with slower GPUs paces every node, and a "
    "node with fewer GPUs than the others changes the world size the job was planned for.",
    fix="Schedule the job on identical nodes (a Slurm constraint or node selector on the GPU model), or "
    "hide the odd GPUs with CUDA_VISIBLE_DEVICES.",
)
FIRMWARE_DIFFERS = Code(
    "GD462",
    "node-firmware-differs",
    "NIC and GPU firmware are alike across nodes",
    what="Compares the RDMA NIC firmware (per HCA type) and the GPU VBIOS versions across nodes.",
    why="Fleets drift when a node is repaired or re-imaged: NIC firmware versions differ in link "
    "training, congestion control and bug fixes, so the odd node behaves differently on the fabric.",
    fix="Flash the odd node's NIC firmware (mlxfwmanager / mstflint) and GPU VBIOS to the fleet's version.",
)
NETWORK_DIFFERS = Code(
    "GD463",
    "node-network-differs",
    "Every node has the same NIC rails, rates, MTU and GPUDirect RDMA",
    what="Compares across nodes the RDMA rails (kind, count, rate), the MTU of the RDMA interfaces, the "
    "speed and MTU of the physical Ethernet interfaces that are up, and whether GPUDirect RDMA is available. "
    "Fewer or slower rails fail; the rest warns.",
    why="A node whose rails are fewer or slower carries less than the others and every collective waits "
    "for it; an MTU that differs across RoCE nodes drops or fragments packets; a node without "
    "GPUDirect RDMA stages its traffic through host memory.",
    fix="Bring the odd node to the fleet's configuration (cables, switch port speed, MTU, nvidia_peermem).",
)
FACTS_MISSING = Code(
    "GD464",
    "node-facts-missing",
    "Every node's facts reached rank 0",
    what="Checks that each node's gpudoctor sent its facts (driver, packages, GPUs, NICs, static findings) "
    "to global rank 0 in the gather of the `nodes` workload, in the shape gpudoctor sends them: facts over "
    "1 MiB, of another shape (a list where a text belongs, an endless text, a number that is not finite) "
    "count as not sent, and forwarded findings with a code this gpudoctor does not know are left out "
    "(gpudoctor/knowledge/node_facts.py). Under `gpudoctor fleet`: each file that cannot be used (unreadable, "
    "not JSON, not a snapshot or report, a newer schema, facts of another shape, a symbolic link inside "
    "a named directory), one line each.",
    why="A node that sent nothing, or nothing usable, cannot be compared: its differences would go unseen.",
    fix="Run gpudoctor the same way on every node (the same torchrun command, the same gpudoctor version).",
)
INTERNODE_BUSBW = Code(
    "GD680",
    "internode-busbw",
    "Inter-node all-reduce reaches what the NICs should carry",
    what="Times an all-reduce over every rank of the job (256 MiB on GPUs, 2 MiB on CPU; median iteration, "
    "the slowest rank's time) and compares its busbw with the NICs' line rate x 0.96 (the slowest node's "
    "rails; NVIDIA/nccl-tests#119: 24 GB/s per 200G NIC). Below 0.8 of it warns, below 0.5 fails. On CPU "
    "(gloo) and without RDMA rails the figure is reported without a verdict.",
    why="One slow link or node paces every collective of the job: the whole run slows by that factor.",
    fix="Read GD681/GD682 (which node or pair is slow), the GD44x findings of that node (ports, rates, "
    "locality, GPUDirect RDMA) and GD463 (nodes that differ).",
)
SLOW_NODE = Code(
    "GD681",
    "slow-node",
    "No node is slow in every pairwise test",
    what="When the inter-node all-reduce is low (or on CPU, where there is no expectation) and there are 3 "
    "or more nodes, runs all-reduce between node pairs, all disjoint pairs at once, for 3 rounds of the "
    "round-robin circle method (each node meets 3 partners, whatever the node count); a pair's figure is its "
    "best iteration, so a passing hiccup names nobody. A node whose every "
    "pair ran below 0.7 of the typical pair (the upper quartile of all pair results) is named (the 0.7 is a "
    "heuristic). Its own intra-node figure "
    "(all-reduce over its ranks, or a memory copy) tells a node problem from a network problem. With two "
    "nodes and a low inter-node figure (GD680), the node whose own figure is low is named.",
    why="The slow node paces the job; a node slow with every partner is the node's own NIC, cable, switch "
    "port or (if its intra-node figure is low too) the node itself. NCCL's maintainers isolate it the "
    "same way (NVIDIA/nccl#325: if 1<->3 and 2<->4 are good but 1<->2 is bad, it is the fabric).",
    fix="Drain the named node; look at its GD44x findings; swap its cable or switch port, or fix the node "
    "(GPU clocks, PCIe, GD4/GD8) when its intra-node figure is low too.",
)
SLOW_PAIR = Code(
    "GD682",
    "slow-pair",
    "No node pair is slow while both nodes are fast with others",
    what="From the same pairwise rounds: a pair that ran below 0.7 of the typical pair while neither node is "
    "slow with its other partners, measured again (the better figure counts) before it is named. With only "
    "two nodes, a low inter-node figure names the pair unless one node's own figure is low.",
    why="A pair that is slow only together is the fabric between them (a routing collision, a bad switch-"
    "to-switch link), not either node (NVIDIA/nccl#325).",
    fix="Check the switch path between the two nodes (UFM, ibdiagnet, the spine links' counters); with "
    "adaptive routing off, try enabling it.",
)
INTRA_SLOW = Code(
    "GD683",
    "node-intra-slow",
    "Every node's own figure is like the others'",
    what="Compares each node's intra-node figure (all-reduce over its own ranks, or a device memory copy "
    "with one rank per node), measured on all nodes at once, with the median of the nodes of the same "
    "shape; below 0.7 of it warns (a heuristic). Under `gpudoctor fleet`: each report's all-reduce busbw "
    "where it is bandwidth-bound, against the median of the reports measured alike (device, backend, ranks).",
    why="A node that is slow on its own (GPU clocks, a PCIe link trained down, NVLink down, a busy or "
    "throttled CPU) slows every step; its network may be fine.",
    fix="Run `gpudoctor check` on that node alone and read its GD4/GD5/GD8 findings.",
)
NOT_COMPLETED = Code(
    "GD684",
    "nodes-not-completed",
    "The cross-node tests ran to the end",
    what="Says which rank failed or did not answer when the cross-node workload (facts gather, inter-node "
    "all-reduce, pairwise rounds) could not complete.",
    why="A node that cannot take part in a collective here hangs or breaks a training job the same way.",
    fix="Read the named rank's error and the DDP findings (GD71x); a node that does not answer often has "
    "its network down (GD440) or is firewalled from the others.",
)
CODES = [
    COUNTERS_GROWING,
    STACK_DIFFERS,
    GPUS_DIFFER,
    FIRMWARE_DIFFERS,
    NETWORK_DIFFERS,
    FACTS_MISSING,
    INTERNODE_BUSBW,
    SLOW_NODE,
    SLOW_PAIR,
    INTRA_SLOW,
    NOT_COMPLETED,
]
