"""The verbs binding where no RDMA exists: layouts checked, a clear refusal, never a crash."""

from __future__ import annotations

import copy
import os

import pytest

from transport import verbs
from transport.errors import NoRdmaError, VerbsLayoutError
from transport.topology import cable_geometry

pytestmark = pytest.mark.skipif(
    not os.path.exists("/usr/include/infiniband/verbs.h"), reason="libibverbs-dev is not installed (make apt)"
)


def test_ctypes_layouts_match_the_installed_header() -> None:
    measured = verbs.measured_layouts()
    assert set(measured) == set(verbs.LAYOUTS)
    verbs.check_layouts(measured)
    assert measured["ibv_qp_attr"]["fields"]["ah_attr"] == verbs.QpAttr.ah_attr.offset


def test_a_layout_mismatch_refuses_to_load() -> None:
    measured = copy.deepcopy(verbs.measured_layouts())
    measured["ibv_qp_attr"]["fields"]["sq_psn"] += 4
    measured["ibv_mr"]["size"] += 8
    with pytest.raises(
        VerbsLayoutError, match=r"ibv_qp_attr.sq_psn at 28, ctypes has 24.*sizeof\(struct ibv_mr\)"
    ):
        verbs.check_layouts(measured)


def test_the_ipv4_mapped_gid_is_roce_v2_shaped() -> None:
    assert verbs.ipv4_mapped_gid("198.19.0.1").hex() == "00000000000000000000ffffc6130001"


def test_no_rdma_is_a_clear_error() -> None:
    try:
        names = verbs.list_devices()
    except NoRdmaError as exc:
        assert str(exc).startswith("no RDMA on this node:") and "--fabric tcp" in str(exc)
    else:
        pytest.skip(f"this node has RDMA devices {names}: the soft-RoCE lane tests the verbs fabric")


def test_verbs_communicator_refuses_before_touching_the_network() -> None:
    from transport.comm import Communicator

    spec = cable_geometry(0, 2, "127.77")
    try:
        verbs.list_devices()
        pytest.skip("this node has RDMA devices")
    except NoRdmaError:
        pass
    with pytest.raises(NoRdmaError, match="no RDMA on this node"):
        Communicator(spec, fabric="verbs", setup_timeout_s=1)
