"""Put on PYTHONPATH by ``ffpa-patch run``: activates ffpa_patch in every Python process."""
from ffpa_patch.bootstrap import activate_and_chain

activate_and_chain(__file__)
