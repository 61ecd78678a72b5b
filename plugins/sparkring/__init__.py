"""Controller-side SparkRing code shared by the Ansible plugins and tests (never shipped to nodes).

`sparkring.cluster` is the one source of the cluster inventory schema and the ring geometry;
`sparkring.hostvars` turns a validated cluster into the hostvars and groups every stage reads.
"""
