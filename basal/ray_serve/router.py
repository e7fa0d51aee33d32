"""The Ray Serve request router of a basal deployment: state affinity with a power-of-two fallback.

Ray Serve calls `choose_replicas` for each pending request and probes the replicas of each returned rank in
turn, sending the request to the least loaded replica of the first rank that accepts it. The ranking itself is
`basal.ray_serve.affinity.rank_replicas`; this class only adapts Ray's types. The ingress passes the request's
affinity key as the `affinity` keyword of the handle call.
"""

from __future__ import annotations

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from basal.ray_serve.affinity import ROUTER_MAX_QUEUE, rank_replicas


class StateAffinityRouter(FIFOMixin, RequestRouter):
    max_queue: int = ROUTER_MAX_QUEUE  # requests on the preferred replica before new ones spill over

    def initialize_state(self, max_queue: int = ROUTER_MAX_QUEUE, **_: object) -> None:
        """Called by Ray Serve with the deployment's `request_router_kwargs`."""
        self.max_queue = max_queue

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        key = pending_request.kwargs.get("affinity") if pending_request is not None else None
        return rank_replicas(
            key,
            candidate_replicas,
            name=lambda r: r.replica_id.unique_id,
            queue_len=lambda r: self._replica_queue_len_cache.get(r.replica_id),
            max_queue=self.max_queue,
        )
