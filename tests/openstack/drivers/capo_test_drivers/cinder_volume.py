"""A Cinder volume driver with no storage behind it.

Cinder's own FakeLoggingVolumeDriver (shipped with Cinder, used by its functional tests) keeps
volumes as database rows only, but it inherits the LVM driver's image handling: a volume made
from an image (a server's root volume) is downloaded, inspected with qemu-img through privsep
and written to a block device, none of which exists here. This one says every image is already
"cloned" into the new volume, as a storage back end with copy-on-write clones does, so the
volume is ready at once and Cinder records the image's metadata on it (it is bootable).
"""

from cinder.tests import fake_driver


class NoStorageVolumeDriver(fake_driver.FakeLoggingVolumeDriver):
    def clone_image(self, context, volume, image_location, image_meta, image_service):
        return {}, True

    def copy_volume_to_image(self, context, volume, image_service, image_meta):
        pass

    def _update_volume_stats(self):
        # A pool that may hold multiattach volumes, as LVM's reports it: the scheduler then
        # places a volume of a type with `multiattach="<is> True"` here.
        super()._update_volume_stats()
        for pool in self._stats.get("pools", []):
            pool["multiattach"] = True
