"""An ML2 mechanism driver that binds every port on any host, with no agent.

Nova's compute (with the fake virt driver) asks Neutron to bind each server's port to its host.
Without an agent on that host, ML2's own drivers leave the port `binding_failed` and Nova puts
the server in ERROR. This driver binds the port's first segment as an Open vSwitch port and
marks it ACTIVE, as an agent would once it wired the port up. It also registers a trunk driver
without an agent, so the trunk plugin loads (it refuses to start unless some loaded driver
supports trunks).

Neutron's own `test` mechanism driver binds only on magic host names and keeps the bound ports
in process memory, asserting on them: a restarted neutron-api (a fault test stops it) would then
fail every update of a port it bound before. This one keeps no state.
"""

from neutron_lib.api.definitions import portbindings
from neutron_lib import constants
from neutron_lib.plugins.ml2 import api
from neutron_lib.services.trunk import constants as trunk_constants
from neutron.services.trunk.drivers import base as trunk_base

NAME = "capo_bind_all"


class AgentlessTrunkDriver(trunk_base.DriverBase):
    """Trunks on ports bound by this driver: accepted and stored; no agent wires them."""

    @property
    def is_loaded(self):
        return True


class BindAllMechanismDriver(api.MechanismDriver):
    def initialize(self):
        # Registers itself with the trunk plugin when that plugin starts (after ML2).
        self.trunk_driver = AgentlessTrunkDriver(
            NAME,
            (portbindings.VIF_TYPE_OVS,),
            (trunk_constants.SEGMENTATION_TYPE_VLAN,),
            agent_type=None,
            can_trunk_bound_port=True,
        )

    def bind_port(self, context):
        if not context.host:
            return
        for segment in context.segments_to_bind:
            context.set_binding(
                segment[api.ID],
                portbindings.VIF_TYPE_OVS,
                {portbindings.CAP_PORT_FILTER: True},
                status=constants.PORT_STATUS_ACTIVE,
            )
            return
