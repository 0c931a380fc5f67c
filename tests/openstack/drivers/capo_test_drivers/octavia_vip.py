"""An Octavia network driver: real VIP ports in Neutron, everything else no-op.

With no amphorae (the no-op compute and amphora drivers), Octavia's own no-op network driver
invents the VIP's port and address, so nothing in Neutron backs them: a floating IP cannot be
attached to the VIP, as CAPO and capo-rs do for a cluster's API. Octavia's Neutron driver would
also plug the VIP into the amphora's server, which does not exist. This driver takes the VIP's
port from the Neutron driver (allocate it on the requested subnet, look networks, subnets and
ports up, delete it with the load balancer) and the rest, which would act on amphorae, from the
no-op driver.
"""

import threading

from octavia.network.drivers.neutron import allowed_address_pairs
from octavia.network.drivers.noop_driver import driver as noop


class VipPortNetworkDriver(noop.NoopNetworkDriver):
    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._neutron_driver = None

    @property
    def _neutron(self):
        # Built on first use: Octavia loads its network driver before Neutron may be up.
        with self._lock:
            if self._neutron_driver is None:
                self._neutron_driver = allowed_address_pairs.AllowedAddressPairsDriver()
            return self._neutron_driver

    def allocate_vip(self, loadbalancer):
        return self._neutron.allocate_vip(loadbalancer)

    def deallocate_vip(self, vip):
        self._neutron.deallocate_vip(vip)

    def get_network(self, network_id, context=None):
        return self._neutron.get_network(network_id, context=context)

    def get_subnet(self, subnet_id, context=None):
        return self._neutron.get_subnet(subnet_id, context=context)

    def get_port(self, port_id, context=None):
        return self._neutron.get_port(port_id, context=context)

    def get_security_group_by_id(self, sg_id, context=None):
        return self._neutron.get_security_group_by_id(sg_id, context=context)
