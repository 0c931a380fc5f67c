"""Fills the test cloud with what capo-rs's tests expect, through the real APIs (idempotent).

Run by up.sh with the stack's venv, in two phases:
  identity   once Keystone answers: the catalog, the service users, the tenant `capo` (user
             `capo`) and its roles.
  resources  once every service answers: flavors, an image, the external networks `public`
             and `capo-rs-tiny-external` (one address), the tenant's network
             `capo-rs-lb-tests`, a key pair and an application credential for `capo`, no room
             for ports, servers or volumes in project `capo-rs-quota`, room in `capo-rs-peers`
             (CAPO v0.14.7's clusters) and `capo-rs-peers-rs` (capo-rs's, beside them); then the
             clouds.yaml the tests read (clouds `capo`, `capo-appcred`, `capo-quota`,
             `capo-peers`, `capo-peers-rs`, `capo-takeover`, `capo-admin`).

Settings come from the environment up.sh exports (CAPO_OS_*); nothing is printed that holds a
secret.
"""

import os
import sys

import openstack
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

ENV = os.environ
REGION = ENV["CAPO_OS_REGION"]
KEYSTONE = ENV["CAPO_OS_KEYSTONE_URL"]
SERVICE_PASS = ENV["CAPO_OS_SERVICE_PASS"]
TENANT_PASS = ENV["CAPO_OS_TENANT_PASS"]
APPCRED_SECRET = ENV["CAPO_OS_APPCRED_SECRET"]
CLOUDS_YAML = ENV["CAPO_OS_CLOUDS_YAML"]
IMAGE_FILE = ENV["CAPO_OS_IMAGE_FILE"]

TENANT = "capo"
# A second project of the tenant's user with no room for ports, servers or volumes: where the
# recorded answers take Neutron's, Nova's and Cinder's quota errors.
QUOTA_PROJECT = "capo-rs-quota"
# A third project of the same user, where CAPO v0.14.7 (tests/capo) builds its clusters: its
# scenarios take no census of `capo`, so they run beside the tests that do.
PEERS_PROJECT = "capo-rs-peers"
PEERS_RS_PROJECT = "capo-rs-peers-rs"
TAKEOVER_PROJECT = "capo-rs-takeover"
# Where docs/first-cluster.md's commands build its cluster (tests/it/first_cluster.rs).
FIRST_PROJECT = "capo-rs-first"
SERVICE_PROJECT = "service"
APPCRED = "capo-rs-tests"
KEYPAIR = "capo-rs-test"
IMAGE = "ubuntu-2404-kube-v1.33.4"
MULTIATTACH_VOLUME_TYPE = "multiattach"
# name: (vcpus, ram MiB, disk GiB, ephemeral GiB)
FLAVORS = {
    "m1.tiny": (1, 512, 1, 0),
    "m1.small": (1, 2048, 20, 0),
    "m1.medium": (2, 4096, 40, 0),
    "m1.large": (4, 8192, 80, 0),
    "m1.ephemeral": (1, 1024, 10, 5),
}
# The image's properties, as an image builder sets them (scale from zero reads os_type).
IMAGE_PROPERTIES = {"os_type": "linux"}
EXTERNAL_NETWORK = "public"
EXTERNAL_CIDR = "172.24.4.0/24"
# An external network with a single address to hand out: where the recorded answers take
# Neutron's "no more addresses" error.
TINY_EXTERNAL_NETWORK = "capo-rs-tiny-external"
TINY_EXTERNAL_CIDR = "172.24.5.0/30"
# The tenant's own network, where the Octavia tests put their load balancers' VIPs.
LB_TEST_NETWORK = "capo-rs-lb-tests"
LB_TEST_CIDR = "10.254.0.0/24"

# type, name, URL
CATALOG = [
    ("identity", "keystone", KEYSTONE + "/v3"),
    ("image", "glance", ENV["CAPO_OS_GLANCE_URL"]),
    ("placement", "placement", ENV["CAPO_OS_PLACEMENT_URL"]),
    ("compute", "nova", ENV["CAPO_OS_NOVA_URL"] + "/v2.1"),
    ("network", "neutron", ENV["CAPO_OS_NEUTRON_URL"]),
    # As most clouds list Cinder: with the project in the path (Keystone fills it in).
    ("block-storage", "cinder", ENV["CAPO_OS_CINDER_URL"] + "/v3/%(project_id)s"),
    ("volumev3", "cinderv3", ENV["CAPO_OS_CINDER_URL"] + "/v3/%(project_id)s"),
    ("load-balancer", "octavia", ENV["CAPO_OS_OCTAVIA_URL"]),
]
SERVICE_USERS = ["glance", "placement", "nova", "neutron", "cinder", "octavia"]
TENANT_ROLES = ["member", "reader", "load-balancer_member"]


def log(message):
    print(f"[setup_cloud] {message}", file=sys.stderr, flush=True)


def auth(username, password, project, **extra):
    return dict(
        auth=dict(
            auth_url=KEYSTONE + "/v3",
            username=username,
            password=password,
            project_name=project,
            user_domain_name="Default",
            project_domain_name="Default",
        ),
        region_name=REGION,
        interface="public",
        identity_api_version="3",
        **extra,
    )


def admin():
    return openstack.connect(**auth("admin", ENV["CAPO_OS_ADMIN_PASS"], "admin"))


def tenant():
    return openstack.connect(**auth(TENANT, TENANT_PASS, TENANT))


def find_or(create, found):
    return found if found is not None else create()


def ensure_role(conn, name):
    return find_or(lambda: conn.identity.create_role(name=name), conn.identity.find_role(name))


def ensure_project(conn, name, description):
    return find_or(
        lambda: conn.identity.create_project(
            name=name, domain_id="default", description=description
        ),
        conn.identity.find_project(name, domain_id="default"),
    )


def ensure_user(conn, name, password, project):
    user = conn.identity.find_user(name, domain_id="default")
    if user is None:
        return conn.identity.create_user(
            name=name, password=password, domain_id="default", default_project_id=project.id
        )
    # The password may have changed with a new run dir: set it again.
    return conn.identity.update_user(user, password=password)


def grant(conn, project, user, role):
    conn.identity.assign_project_role_to_user(project, user, role)


def ensure_endpoints(conn):
    services = {s.type: s for s in conn.identity.services()}
    endpoints = list(conn.identity.endpoints())
    for service_type, name, url in CATALOG:
        service = services.get(service_type) or conn.identity.create_service(
            type=service_type, name=name, enabled=True
        )
        for interface in ("public", "internal", "admin"):
            have = [
                e
                for e in endpoints
                if e.service_id == service.id and e.interface == interface
            ]
            if any(e.url == url for e in have):
                continue
            for stale in have:
                conn.identity.delete_endpoint(stale)
            conn.identity.create_endpoint(
                service_id=service.id, interface=interface, url=url, region_id=REGION
            )


def identity():
    conn = admin()
    ensure_endpoints(conn)
    roles = {name: ensure_role(conn, name) for name in ["admin", "service", *TENANT_ROLES]}
    service = ensure_project(conn, SERVICE_PROJECT, "OpenStack's own services")
    for name in SERVICE_USERS:
        user = ensure_user(conn, name, SERVICE_PASS, service)
        grant(conn, service, user, roles["admin"])
        grant(conn, service, user, roles["service"])
    project = ensure_project(conn, TENANT, "capo-rs's tests")
    user = ensure_user(conn, TENANT, TENANT_PASS, project)
    for name in TENANT_ROLES:
        grant(conn, project, user, roles[name])
    quota_project = ensure_project(conn, QUOTA_PROJECT, "no room: quota errors")
    for name in TENANT_ROLES:
        grant(conn, quota_project, user, roles[name])
    for name, description in [
        (PEERS_PROJECT, "CAPO v0.14.7's clusters"),
        (PEERS_RS_PROJECT, "capo-rs's clusters beside CAPO v0.14.7's"),
        (TAKEOVER_PROJECT, "a cluster CAPO v0.14.7 builds and capo-rs takes over"),
        (FIRST_PROJECT, "the first-cluster page's cluster, as pasted"),
    ]:
        peers_project = ensure_project(conn, name, description)
        for role in TENANT_ROLES:
            grant(conn, peers_project, user, roles[role])
    log("catalog, service users and the tenant are in place")


def ensure_flavors(conn):
    have = {f.name for f in conn.compute.flavors(is_public=None)}
    for name, (vcpus, ram, disk, ephemeral) in FLAVORS.items():
        if name not in have:
            conn.compute.create_flavor(
                name=name, vcpus=vcpus, ram=ram, disk=disk, ephemeral=ephemeral
            )


def ensure_multiattach_volume_type(conn):
    """A public volume type whose volumes more than one server may attach: Cinder sets a
    volume's `multiattach` from this extra spec (the test driver's pool reports the capability),
    and Nova then attaches such a volume only to a server created at microversion 2.60."""
    if conn.block_storage.find_type(MULTIATTACH_VOLUME_TYPE) is None:
        conn.block_storage.create_type(
            name=MULTIATTACH_VOLUME_TYPE, extra_specs={"multiattach": "<is> True"}
        )


def ensure_image(conn):
    image = conn.image.find_image(IMAGE)
    if image is not None and image.status == "active":
        if "capi" not in image.tags:
            conn.image.add_tag(image, "capi")
        if any(getattr(image, k, None) != v for k, v in IMAGE_PROPERTIES.items()):
            conn.image.update_image(image, **IMAGE_PROPERTIES)
        return
    if image is not None:
        conn.image.delete_image(image)
    with open(IMAGE_FILE, "rb") as data:
        conn.image.create_image(
            name=IMAGE,
            tags=["capi"],
            disk_format="raw",
            container_format="bare",
            visibility="public",
            data=data,
            validate_checksum=False,
            **IMAGE_PROPERTIES,
        )


def ensure_external_network(conn, name, physnet, cidr):
    """A flat external network on `physnet` with one subnet of `cidr` (gateway .1)."""
    network = conn.network.find_network(name)
    if network is None:
        network = conn.network.create_network(
            name=name,
            is_router_external=True,
            provider_network_type="flat",
            provider_physical_network=physnet,
        )
    if not list(conn.network.subnets(network_id=network.id)):
        conn.network.create_subnet(
            name=name, network_id=network.id, ip_version=4, cidr=cidr, is_dhcp_enabled=False
        )


def ensure_no_room(conn):
    project = conn.identity.find_project(QUOTA_PROJECT, domain_id="default")
    conn.network.update_quota(project.id, ports=0)
    conn.set_compute_quotas(project.id, instances=0)
    conn.set_volume_quotas(project.id, volumes=0)


def ensure_room(conn, name):
    """The tests' projects get room for several whole clusters at once (each e2e test holds a
    bastion, 3 control-plane machines, a worker and a rollout's extra machine): Nova's default
    of 10 instances stalled two concurrent rollouts, and every later test with them."""
    project = conn.identity.find_project(name, domain_id="default")
    conn.set_compute_quotas(project.id, instances=200, cores=800, ram=1638400)
    conn.set_volume_quotas(project.id, volumes=200, gigabytes=10000, snapshots=200)
    conn.network.update_quota(
        project.id,
        networks=200,
        subnets=400,
        ports=2000,
        routers=100,
        floating_ips=200,
        security_groups=400,
        security_group_rules=4000,
    )


def ensure_tenant_network(conn):
    network = conn.network.find_network(LB_TEST_NETWORK)
    if network is None:
        network = conn.network.create_network(name=LB_TEST_NETWORK)
    if not list(conn.network.subnets(network_id=network.id)):
        conn.network.create_subnet(
            name=LB_TEST_NETWORK, network_id=network.id, ip_version=4, cidr=LB_TEST_CIDR
        )


def ensure_keypair(conn):
    if conn.compute.find_keypair(KEYPAIR) is not None:
        return
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    public = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    conn.compute.create_keypair(name=KEYPAIR, public_key=public.decode() + " capo-rs-test")


def ensure_appcred(conn):
    user_id = conn.current_user_id
    for cred in conn.identity.application_credentials(user=user_id):
        if cred.name == APPCRED:
            return cred.id
    cred = conn.identity.create_application_credential(
        user=user_id, name=APPCRED, secret=APPCRED_SECRET, description="capo-rs's real tier"
    )
    return cred.id


def write_clouds_yaml(appcred_id):
    common = (
        f"    region_name: {REGION}\n"
        "    interface: public\n"
        "    identity_api_version: 3\n"
    )
    def password_cloud(name, user, password, project):
        return (
            f"  {name}:\n"
            "    auth:\n"
            f"      auth_url: {KEYSTONE}/v3\n"
            f"      username: {user}\n"
            f"      password: {password}\n"
            f"      project_name: {project}\n"
            "      user_domain_name: Default\n"
            "      project_domain_name: Default\n" + common
        )
    text = (
        "# generated by tests/openstack/up.sh: the test cloud's credentials\n"
        "clouds:\n"
        + password_cloud("capo", TENANT, TENANT_PASS, TENANT)
        + "  capo-appcred:\n"
        "    auth_type: v3applicationcredential\n"
        "    auth:\n"
        f"      auth_url: {KEYSTONE}/v3\n"
        f"      application_credential_id: {appcred_id}\n"
        f"      application_credential_secret: {APPCRED_SECRET}\n" + common
        + password_cloud("capo-quota", TENANT, TENANT_PASS, QUOTA_PROJECT)
        + password_cloud("capo-peers", TENANT, TENANT_PASS, PEERS_PROJECT)
        + password_cloud("capo-peers-rs", TENANT, TENANT_PASS, PEERS_RS_PROJECT)
        + password_cloud("capo-takeover", TENANT, TENANT_PASS, TAKEOVER_PROJECT)
        + password_cloud("capo-first", TENANT, TENANT_PASS, FIRST_PROJECT)
        + password_cloud("capo-admin", "admin", ENV["CAPO_OS_ADMIN_PASS"], "admin")
    )
    tmp = CLOUDS_YAML + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    os.replace(tmp, CLOUDS_YAML)


def resources():
    conn = admin()
    ensure_flavors(conn)
    ensure_image(conn)
    ensure_multiattach_volume_type(conn)
    ensure_external_network(conn, EXTERNAL_NETWORK, "public", EXTERNAL_CIDR)
    # A /30: the gateway takes .1, so .2 is the only address to hand out.
    ensure_external_network(conn, TINY_EXTERNAL_NETWORK, "tiny", TINY_EXTERNAL_CIDR)
    ensure_no_room(conn)
    ensure_room(conn, TENANT)
    ensure_room(conn, PEERS_PROJECT)
    ensure_room(conn, PEERS_RS_PROJECT)
    ensure_room(conn, TAKEOVER_PROJECT)
    ensure_room(conn, FIRST_PROJECT)
    user = tenant()
    # Neutron makes a project's default security group on its first look: make it now, so a
    # census taken before a test counts it.
    list(user.network.security_groups())
    ensure_tenant_network(user)
    ensure_keypair(user)
    appcred_id = ensure_appcred(user)
    write_clouds_yaml(appcred_id)
    log(f"flavors, image, external network, key pair, application credential; {CLOUDS_YAML}")


if __name__ == "__main__":
    phases = {"identity": identity, "resources": resources}
    if len(sys.argv) != 2 or sys.argv[1] not in phases:
        sys.exit(f"usage: {sys.argv[0]} identity|resources")
    phases[sys.argv[1]]()
