"""The router's admission control (router.admission.Admission) on the engine simulator's clock:
`max_running_per_node` running slots per node, then a first-come first-served queue of at most
`max_waiting` requests, each refused (429) after `max_wait_s`, and the rest refused at once."""

from collections import deque

from radixmesh.cluster.router.admission import AdmissionLimits


class SimAdmission:
    def __init__(self, limits: AdmissionLimits, nodes: int) -> None:
        self.limits = limits
        self.slots = nodes * limits.max_running_per_node
        self.running = 0
        self.waiting: deque[int] = deque()

    def arrive(self, request: int) -> bool | None:
        """True: it runs now (a slot is taken); None: it waits (give it up after limits.max_wait_s);
        False: refused."""
        if self.running < self.slots:
            self.running += 1
            return True
        if len(self.waiting) < self.limits.max_waiting:
            self.waiting.append(request)
            return None
        return False

    def give_up(self, request: int) -> bool:
        """Whether `request` was still waiting (then it is refused, and waits no more)."""
        if request in self.waiting:
            self.waiting.remove(request)
            return True
        return False

    def release(self) -> int | None:
        """A running request ended: the waiting request that takes its slot, if any."""
        self.running -= 1
        if not self.waiting:
            return None
        self.running += 1
        return self.waiting.popleft()
