"""Operations on an app's database file: copies, checks, restores, the backup timer.

```python
from fastapi_lith.ops import Backups, backup, restore, verify
```

One module per step: `backup` (take a copy), `verify` (check one), `restore` (put one back),
`locks` (who holds the file open), `timer` (`Backups`), `files` (names, checksums, fsync);
for continuous replication `replica` (Litestream as the app's child process, restore before
open), `replica_check` (the daily restore-and-compare) and `litestream` (the binary, its
configuration, its commands). `tracing` (OpenTelemetry spans of each command's path) is not
imported here: `Lith` imports it at start only when the app has set a TracerProvider.
Nothing here imports a Unix-only module at import time: `locks` imports `fcntl` when it runs.
"""

from ..exceptions import BackupError, InUse, ReplicaError
from .backup import BackupInfo, backup
from .locks import holders
from .replica import Replica
from .restore import RestoreInfo, restore
from .timer import Backups
from .verify import Report, verify

__all__ = [
    "BackupError",
    "BackupInfo",
    "Backups",
    "InUse",
    "Replica",
    "ReplicaError",
    "Report",
    "RestoreInfo",
    "backup",
    "holders",
    "restore",
    "verify",
]
