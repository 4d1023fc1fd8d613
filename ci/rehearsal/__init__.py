"""The release rehearsal: local stand-ins for the GitHub services the workflows talk to."""
