"""How `make test` spreads the tests over its pytest-xdist workers (tests/conftest.py's
scheduler)."""

from __future__ import annotations


def scheduler(config, log, groups: dict[str, str], cores: int):
    """Whole groups to a worker (`groups`: {tests/<file>::<test>: group}), each other file as one
    unit (its module fixtures), in the collection's order. With more workers than `cores` (CI: -n 3
    on 2) the last runs the "slurm" group and nothing else: those tests mostly wait on the cluster,
    and a worker that shared them left a core idle meanwhile (the cores ~70 % busy for the ~6
    minutes of the SLURM test). Not `--dist loadgroup`: with pytest 9.2 it silently stops grouping
    (pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    # the collection's order (the two long groups first), not by size
    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return groups.get(nodeid.split("[")[0], nodeid.split("::")[0])

        def _assign_work_unit(self, node) -> None:
            apart = len(self.nodes) > cores  # the last worker: the SLURM group's alone
            scope = next(
                (
                    s
                    for s in self.workqueue
                    if not apart or (s == "slurm") == (node is self.nodes[-1])
                ),
                None,
            )
            if scope is None:  # nothing this worker may take: it ends once its tests have run
                node.shutdown()
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ByGroup(config, log)
