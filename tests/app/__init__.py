"""The app layer: Lith, Accounts, the command line, the scaffold, install, release, deploy and the docs."""
