"""The documentation of `docker_host`, the option every module that talks to Docker takes.

module_utils/sparkring_docker.py DOCKER_HOST_OPTION is the argument spec it describes (the
modules reach the daemon only through that file's Docker class), and tests/unit/modules keeps
this text equal to it through ansible-doc.
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  docker_host:
    description: C(DOCKER_HOST) of this rank's Docker daemon; empty uses the default socket.
    type: str
    default: ""
"""
