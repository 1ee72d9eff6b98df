"""MeshOrganizer: placement, removal, remap, versions and serialization, without sockets."""

from __future__ import annotations

import json
import random
from collections import deque

import msgpack
import pytest
from psrv.server.mesh import CONTROLLER_ID, NO_PARENT, MeshMode, MeshOrganizer, Place
from psrv.transport.errors import MeshError, UnknownNodeError


def build(n: int, mode: str = "mesh", fan_out: int = 8) -> MeshOrganizer:
    mesh = MeshOrganizer(mode, fan_out)
    for i in range(1, n + 1):
        mesh.add_node(i, f"10.0.{i // 256}.{i % 256}:{5000 + i}")
    return mesh


def check_tree(mesh: MeshOrganizer) -> None:
    """Independent of validate(): walk from the root, every live node once, fan-out respected."""
    fan_out = mesh.fan_out if mesh.mode is MeshMode.MESH else None
    seen = {CONTROLLER_ID}
    queue = deque([(CONTROLLER_ID, 0)])
    while queue:
        nid, depth = queue.popleft()
        place = mesh.place(nid)
        assert place.depth == depth
        if fan_out is not None:
            assert len(place.children) <= fan_out
        for child in place.children:
            assert child not in seen, f"node {child} reached twice"
            assert mesh.parent(child) == nid
            seen.add(child)
            queue.append((child, depth + 1))
    assert seen == {CONTROLLER_ID, *mesh.node_ids()}
    mesh.validate()


def test_plain_mode_puts_every_node_under_the_controller():
    mesh = build(50, "plain")
    assert mesh.mode is MeshMode.PLAIN
    assert mesh.children(CONTROLLER_ID) == tuple(range(1, 51))
    assert all(mesh.parent(i) == CONTROLLER_ID and mesh.children(i) == () for i in range(1, 51))
    assert mesh.depth() == 1
    assert mesh.remove_node(7) == []
    assert mesh.remap(3) == Place(3, CONTROLLER_ID, (), 1)
    check_tree(mesh)


@pytest.mark.timeout(30)
def test_8192_nodes_mesh_fan_out_8_depth_at_most_5():
    mesh = build(8192)
    assert len(mesh) == 8192
    assert mesh.depth() == 5  # 8+64+512+4096 = 4680 fit in depth 4, the rest go to depth 5
    check_tree(mesh)
    counts = [len(mesh.children(i)) for i in [CONTROLLER_ID, *mesh.node_ids()]]
    assert max(counts) == 8
    # breadth first: every level is full before the next one starts
    depths = [mesh.place(i).depth for i in mesh.node_ids()]
    assert [depths.count(d) for d in range(1, 5)] == [8, 64, 512, 4096]


def test_breadth_first_placement_order():
    mesh = build(12, fan_out=3)
    assert mesh.children(0) == (1, 2, 3)
    assert mesh.children(1) == (4, 5, 6)
    assert mesh.children(2) == (7, 8, 9)
    assert mesh.children(3) == (10, 11, 12)
    assert mesh.place(12) == Place(12, 3, (), 2)
    assert mesh.place(0).parent == NO_PARENT


def test_neighbours_and_relay_targets():
    mesh = build(12, fan_out=3)
    assert mesh.neighbours(0) == (1, 2, 3)
    assert mesh.neighbours(2) == (0, 7, 8, 9)
    assert mesh.neighbours(8) == (2,)
    assert mesh.relay_targets(2, came_from=7) == (0, 8, 9)
    assert mesh.relay_targets(2) == (0, 7, 8, 9)
    assert mesh.relay_targets(8, came_from=2) == ()


def test_remove_moves_children_to_lightest_node_without_exceeding_fan_out():
    mesh = build(12, fan_out=3)  # 0:(1,2,3) 1:(4,5,6) 2:(7,8,9) 3:(10,11,12)
    version = mesh.version
    moved = mesh.remove_node(2)
    assert moved == [7, 8, 9]
    assert mesh.version == version + 1
    assert 2 not in mesh
    # root now has 2 children and room; the lightest nodes are leaves (0 children):
    # ties broken by lowest depth, then lowest id -> 4 is the first leaf at depth 2.
    assert mesh.parent(7) == 4
    assert mesh.parent(8) == 5  # 4 now has one child; 5 is a leaf at depth 2
    assert mesh.parent(9) == 6
    check_tree(mesh)


def test_remove_never_moves_a_subtree_under_its_own_descendant():
    mesh = build(3, fan_out=1)  # a chain 0 -> 1 -> 2 -> 3
    assert mesh.depth() == 3
    assert mesh.remove_node(1) == [2]
    assert mesh.parent(2) == 0 and mesh.parent(3) == 2
    check_tree(mesh)


def test_remove_idempotent_and_controller_protected():
    mesh = build(5, fan_out=2)
    version = mesh.version
    assert mesh.remove_node(99) == []
    assert mesh.version == version
    with pytest.raises(MeshError, match="controller"):
        mesh.remove_node(CONTROLLER_ID)
    with pytest.raises(UnknownNodeError, match="99"):
        mesh.place(99)


def test_add_existing_node_updates_address_only():
    mesh = build(5, fan_out=2)
    before = mesh.place(4)
    version = mesh.version
    assert mesh.add_node(4, "10.9.9.9:1") == before
    assert mesh.address(4) == "10.9.9.9:1"
    assert mesh.version == version + 1
    assert mesh.add_node(4, "10.9.9.9:1") == before
    assert mesh.version == version + 1  # no change, no new version


def test_remap_moves_to_a_shallower_free_place_keeping_its_subtree():
    mesh = build(7, fan_out=2)  # 0:(1,2) 1:(3,4) 2:(5,6) 3:(7,)
    assert mesh.remove_node(2) == [5, 6]
    assert (mesh.parent(5), mesh.parent(6)) == (4, 5)  # leaves first; ties: depth, then id
    check_tree(mesh)
    # root now has room at depth 1: remapping a deep node brings it (and its subtree) up
    deep = max(mesh.node_ids(), key=lambda i: (mesh.place(i).depth, i))
    subtree_before = mesh.children(deep)
    version = mesh.version
    place = mesh.remap(deep)
    assert place.parent == CONTROLLER_ID and place.depth == 1
    assert place.children == subtree_before
    assert mesh.version == version + 1
    check_tree(mesh)


def test_remap_without_a_better_place_changes_nothing():
    mesh = build(3, fan_out=8)
    version = mesh.version
    assert mesh.remap(2) == Place(2, 0, (), 1)
    assert mesh.children(0) == (1, 2, 3)
    assert mesh.version == version


def test_remap_never_under_own_descendant():
    mesh = build(3, fan_out=1)  # chain 0 -> 1 -> 2 -> 3; only 3 has room
    place = mesh.remap(1)
    # 1's own subtree (2, 3) is excluded, so it stays where it is
    assert place == Place(1, 0, (2,), 1)
    check_tree(mesh)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fan_out", [2, 8])
def test_random_churn_keeps_the_tree_whole_and_versions_grow(fan_out):
    rng = random.Random(fan_out)
    mesh = build(2000, fan_out=fan_out)
    next_id = 2001
    last_version = mesh.version
    for step in range(600):
        ids = mesh.node_ids()
        action = rng.random()
        if action < 0.4 and ids:
            victim = rng.choice(ids)
            old_children = mesh.children(victim)
            moved = mesh.remove_node(victim)
            assert moved == list(old_children)
            assert victim not in mesh
        elif action < 0.7 and ids:
            mesh.remap(rng.choice(ids))
        else:
            mesh.add_node(next_id, f"h:{next_id}")
            next_id += 1
        assert mesh.version >= last_version
        last_version = mesh.version
        if step % 50 == 0:
            check_tree(mesh)
    check_tree(mesh)


def test_every_change_is_one_version():
    mesh = MeshOrganizer("mesh", 2)
    versions = [mesh.version]
    for i in range(1, 8):
        mesh.add_node(i, "a")
        versions.append(mesh.version)
    mesh.remove_node(1)
    versions.append(mesh.version)
    assert versions == list(range(9))


@pytest.mark.parametrize("mode", ["plain", "mesh"])
def test_to_dict_round_trip_is_exact_and_msgpackable(mode):
    mesh = build(300, mode, fan_out=3)
    rng = random.Random(5)
    for victim in rng.sample(mesh.node_ids(), 40):
        mesh.remove_node(victim)
    for nid in rng.sample(mesh.node_ids(), 20):
        mesh.remap(nid)
    d = mesh.to_dict()
    wire = msgpack.unpackb(msgpack.packb(d))
    assert wire == d
    assert json.loads(json.dumps(d)) == d
    copy = MeshOrganizer.from_dict(wire)
    assert copy.to_dict() == d
    assert copy.version == mesh.version and copy.places() == mesh.places()
    # the copy makes the same decisions as the original afterwards
    assert copy.add_node(1000, "x") == mesh.add_node(1000, "x")
    assert copy.remove_node(copy.node_ids()[3]) == mesh.remove_node(mesh.node_ids()[3])
    assert copy.to_dict() == mesh.to_dict()


def test_from_dict_rejects_broken_snapshots():
    d = build(6, fan_out=2).to_dict()
    with pytest.raises(MeshError, match="format"):
        MeshOrganizer.from_dict({**d, "format": 99})
    with pytest.raises(MeshError, match="nodes"):
        MeshOrganizer.from_dict({k: v for k, v in d.items() if k != "nodes"})
    cyc = json.loads(json.dumps(d))
    cyc["nodes"][1][3].append(1)  # node 1 lists itself as its child
    with pytest.raises(MeshError):
        MeshOrganizer.from_dict(cyc)
    orphan = json.loads(json.dumps(d))
    orphan["nodes"].append([77, 3, "x", []])  # parent 3 does not list it
    with pytest.raises(MeshError, match="77"):
        MeshOrganizer.from_dict(orphan)
    with pytest.raises(MeshError):
        MeshOrganizer.from_dict("not a dict")


def test_validate_detects_fan_out_violation():
    mesh = build(3, fan_out=8)
    mesh.fan_out = 2
    with pytest.raises(MeshError, match="fan_out"):
        mesh.validate()


def test_bad_arguments_are_clear_errors():
    with pytest.raises(MeshError, match="mode"):
        MeshOrganizer("star")
    with pytest.raises(MeshError, match="fan_out"):
        MeshOrganizer("mesh", 0)
    mesh = MeshOrganizer("mesh")
    for bad in (0, -1, True, "3"):
        with pytest.raises(MeshError, match="positive int"):
            mesh.add_node(bad, "x")


def test_allocate_id_never_repeats():
    mesh = MeshOrganizer("mesh", controller_address="127.0.0.1:7000")
    a = mesh.allocate_id()
    mesh.add_node(a, "x")
    mesh.add_node(10, "y")
    b = mesh.allocate_id()
    assert a == 1 and b == 11
    assert mesh.address(CONTROLLER_ID) == "127.0.0.1:7000"
    copy = MeshOrganizer.from_dict(mesh.to_dict())
    assert copy.allocate_id() == 12


@pytest.mark.timeout(60)
def test_8192_nodes_random_removals_and_remaps_keep_the_tree_whole():
    rng = random.Random(8192)
    mesh = build(8192)
    last_version = mesh.version
    for step in range(1, 801):
        nid = rng.choice(mesh.node_ids())
        if step % 2:
            children = mesh.children(nid)
            assert mesh.remove_node(nid) == list(children)
            for child in children:
                assert child in mesh and nid not in mesh
        else:
            mesh.remap(nid)
        assert mesh.version >= last_version
        last_version = mesh.version
        if step % 200 == 0:
            check_tree(mesh)
    assert len(mesh) == 8192 - 400
    check_tree(mesh)
    copy = MeshOrganizer.from_dict(msgpack.unpackb(msgpack.packb(mesh.to_dict())))
    assert copy.version == mesh.version and copy.places() == mesh.places()


def subtree(mesh: MeshOrganizer, root: int) -> set[int]:
    out, queue = set(), [root]
    while queue:
        nid = queue.pop()
        out.add(nid)
        queue.extend(mesh.children(nid))
    return out


def test_adopter_matches_a_brute_force_choice():
    """The first orphan goes to the node a full scan picks: fewest children, then depth, then id."""
    rng = random.Random(11)
    mesh = build(400, fan_out=3)
    for _ in range(150):
        victim = rng.choice(mesh.node_ids())
        orphans = mesh.children(victim)
        excluded = {victim}.union(*(subtree(mesh, o) for o in orphans))
        counts = {n: len(mesh.children(n)) for n in [CONTROLLER_ID, *mesh.node_ids()]}
        counts[mesh.parent(victim)] -= 1
        candidates = [
            (counts[n], mesh.place(n).depth, n)
            for n in counts
            if n not in excluded and counts[n] < mesh.fan_out
        ]
        mesh.remove_node(victim)
        if orphans:
            assert mesh.parent(orphans[0]) == min(candidates)[2]
        if rng.random() < 0.5:
            mesh.add_node(max(mesh.node_ids()) + 1, "new")
    check_tree(mesh)
